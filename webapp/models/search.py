"""Full-text search over memories and messages, in the database itself.

SQLite: the FTS5 tables `agent_memories_fts` and `messages_fts` (external content, kept in step by triggers).
PostgreSQL: the generated `search_vector` columns with GIN indexes. Both are made by the migration
680a29028759; both stem English words, so "roses" finds "rose". Callers get a subquery of (id, rank) to join
and scope as they need: the rank orders best first.
"""

import re
from enum import Enum

import sqlalchemy as sa

from webapp.extensions import db

TERM = re.compile(r"[^\W_]+")
MAX_TERMS = 16
TABLES = ("agent_memories", "messages")
# Words nearly every text has: they would match most rows and rank nothing. Exactly PostgreSQL's 'english'
# stop words (FTS5 has no such list): a query of them only would find nothing there (an empty tsquery) and
# everything here, so both databases leave them out before searching.
STOP_WORDS = frozenset(
    "a about above after again against all am an and any are as at be because been before being below between "
    "both but by can did do does doing don down during each few for from further had has have having he her "
    "here hers herself him himself his how i if in into is it its itself just me more most my myself no nor "
    "not now of off on once only or other our ours ourselves out over own s same she should so some such t "
    "than that the their theirs them themselves then there these they this those through to too under until "
    "up very was we were what when where which while who whom why will with you your yours yourself "
    "yourselves".split()
)


class Match(Enum):
    ANY_WORD = "any"  # recall: any of the words, the best matches first
    ALL_PREFIXES = "all"  # the ledger's search box: every word, as a word or the start of one


def terms(text: str) -> list[str]:
    """The searchable words of text (letters and digits, no stop words), lowercased, at most MAX_TERMS."""
    return [w for w in TERM.findall(text.casefold()) if w not in STOP_WORDS][:MAX_TERMS]


def ranked(model: type, text: str, match: Match, *scope: sa.ColumnElement[bool]) -> sa.Subquery | None:
    """(id, rank) of the rows of `model` (AgentMemory or Message) matching text and the scope's conditions on
    its columns, lower rank first; None when text has no words. The scope is applied inside the search, so a
    common word ranks only the caller's rows (an agent's memories, its conversations' messages), not every row
    of the table that holds it."""
    words = terms(text)
    if not words:
        return None
    if db.engine.dialect.name == "sqlite":
        return _sqlite(model, words, match, scope)
    return _postgres(model, words, match, scope)


def _sqlite(model: type, words: list[str], match: Match, scope: tuple) -> sa.Subquery:
    if match is Match.ANY_WORD:
        query = " OR ".join(f'"{w}"' for w in words)
    else:
        query = " ".join(f'"{w}"*' for w in words)
    fts = sa.table(f"{model.__tablename__}_fts", sa.column("rowid"))
    # "+rowid": the scope filters the matches as they come. A plain `rowid IN` is a constraint FTS5 answers by
    # one lookup per scoped row (seconds for an agent's 20,000 messages; bench.recall).
    in_scope = sa.literal_column(f"+{fts.name}.rowid").in_(sa.select(model.id).where(*scope))
    statement = sa.select(
        fts.c.rowid.label("id"), sa.func.bm25(sa.literal_column(fts.name)).label("rank")
    ).where(sa.literal_column(fts.name).op("MATCH")(query), in_scope)
    return statement.subquery(f"{fts.name}_hits")


def _postgres(model: type, words: list[str], match: Match, scope: tuple) -> sa.Subquery:
    """On the table itself, so PostgreSQL can combine the GIN index with the scope's own indexes."""
    query = " | ".join(words) if match is Match.ANY_WORD else " & ".join(f"{w}:*" for w in words)
    search_vector = sa.literal_column(f"{model.__tablename__}.search_vector")
    tsquery = sa.func.to_tsquery("english", query)
    statement = sa.select(model.id, (-sa.func.ts_rank_cd(search_vector, tsquery)).label("rank")).where(
        search_vector.op("@@")(tsquery), *scope
    )
    return statement.subquery(f"{model.__tablename__}_hits")


def rebuild() -> dict[str, int]:
    """Rebuild the index of every searched table from the table itself; returns the rows per table."""
    counts = {}
    for table in TABLES:
        if db.engine.dialect.name == "sqlite":
            db.session.execute(sa.text(f"INSERT INTO {table}_fts({table}_fts) VALUES ('rebuild')"))
        else:
            db.session.execute(sa.text(f"REINDEX INDEX ix_{table}_search_vector"))
        counts[table] = db.session.scalar(sa.text(f"SELECT count(*) FROM {table}"))
    db.session.commit()
    return counts
