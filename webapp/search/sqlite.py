"""Search on SQLite: FTS5 for words, sqlite-vec for vectors.

Words: the FTS5 tables `agent_memories_fts` and `messages_fts` (external content, kept in step by triggers; made
by the migration 680a29028759), ranked by FTS5's own bm25() (Porter stemming, so "roses" finds "rose").

Vectors: the vec0 tables `memory_vectors` (partitioned by agent) and `message_vectors` (partitioned by chat),
made here at first use with the dimensions of the model that fills them (a model with other dimensions
replaces them: its vectors must all be written again anyway). They need the sqlite-vec extension loaded on
each connection (webapp.extensions); without it, search is by words only.
"""

import sqlalchemy as sa

from webapp.extensions import db
from webapp.search.terms import Match

VECTOR_TABLES = {
    "memory": ("memory_vectors", "memory_id", "agent_id"),
    "message": ("message_vectors", "message_id", "chat_id"),
}


def lexical(model: type, words: list[str], match: Match, scope: tuple) -> sa.Subquery:
    """(id, rank) of the matching rows within the scope, lower rank first."""
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


def rebuild_lexical(tables: tuple[str, ...]) -> None:
    for table in tables:
        db.session.execute(sa.text(f"INSERT INTO {table}_fts({table}_fts) VALUES ('rebuild')"))


def refresh_term_stats() -> None:
    """FTS5 keeps its own statistics."""


def vectors_available() -> bool:
    try:
        db.session.execute(sa.text("SELECT vec_version()"))
    except sa.exc.OperationalError:
        db.session.rollback()
        return False
    return True


def ensure_vector_tables(dimensions: int) -> None:
    """The vec0 tables, for vectors of these dimensions (replacing tables made for others)."""
    for table, key, owner in VECTOR_TABLES.values():
        sql = db.session.scalar(sa.text("SELECT sql FROM sqlite_master WHERE name = :t"), {"t": table})
        if sql and f"float[{dimensions}]" in sql:
            continue
        if sql:
            db.session.execute(sa.text(f"DROP TABLE {table}"))
        db.session.execute(
            sa.text(
                f"CREATE VIRTUAL TABLE {table} USING vec0({key} integer primary key, {owner} integer partition key, "
                f"model text, embedding float[{dimensions}] distance_metric=cosine)"
            )
        )


def vector_dimensions() -> int | None:
    sql = db.session.scalar(sa.text("SELECT sql FROM sqlite_master WHERE name = 'memory_vectors'"))
    if not sql:
        return None
    return int(sql.split("float[", 1)[1].split("]", 1)[0])


def store_vectors(kind: str, rows: list[tuple[int, int, str, bytes]]) -> None:
    """(id, owner id, model, float32 bytes) rows; a row already there is replaced."""
    table, key, owner = VECTOR_TABLES[kind]
    ids = [row[0] for row in rows]
    delete_vectors(kind, ids)
    db.session.execute(
        sa.text(f"INSERT INTO {table}({key}, {owner}, model, embedding) VALUES (:id, :owner, :model, :v)"),
        [{"id": i, "owner": o, "model": m, "v": v} for i, o, m, v in rows],
    )


def delete_vectors(kind: str, ids: list[int]) -> None:
    table, key, _owner = VECTOR_TABLES[kind]
    if ids:
        db.session.execute(
            sa.text(f"DELETE FROM {table} WHERE {key} IN ({','.join(map(str, map(int, ids)))})")
        )


def nearest(kind: str, model: str, vector: bytes, owners: sa.Select, k: int) -> list[tuple[int, float]]:
    """(id, cosine distance) of the k nearest vectors of this model among the owners' (an agent's memories, or
    the messages of some chats), nearest first. vec0 answers k per partition; the best k of those are kept."""
    table, key, owner = VECTOR_TABLES[kind]
    owner_ids = list(db.session.scalars(owners))
    if not owner_ids:
        return []
    rows = db.session.execute(
        sa.text(
            f"SELECT {key}, distance FROM {table} WHERE embedding MATCH :v AND k = :k "
            f"AND model = :model AND {owner} IN ({','.join(map(str, map(int, owner_ids)))})"
        ),
        {"v": vector, "k": k, "model": model},
    )
    return sorted(((row[0], row[1]) for row in rows), key=lambda row: row[1])[:k]
