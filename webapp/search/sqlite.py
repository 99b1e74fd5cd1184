"""Search on SQLite: FTS5 for words, sqlite-vec for vectors.

Words: the FTS5 tables `agent_memories_fts` and `messages_fts` (external content, kept in step by triggers; made
by the migration 680a29028759), ranked by FTS5's own bm25() (Porter stemming, so "roses" finds "rose"). How many
rows hold each word is read from their fts5vocab tables (`*_fts_vocab`), to leave the very common words out
(webapp.search.terms.informative).

Vectors: the tables `memory_vectors` and `message_vectors` (made by the migration e2a4c6e8f0b2): each row holds
the vector (float32), its sign bits (sqlite-vec's vec_quantize_binary) and the model that wrote it, under a
covering index of (owner, model, bits, id). A search reads the owner's range of that index (an agent's memories,
the messages of its chats), takes the nearest by Hamming distance, and ranks those by their exact cosine distance.
Measured (bench.recall, 200,000 vectors, a scope of 20,000): 8 ms, where sqlite-vec's own vec0 table, which
compares every vector of a table (or of each partition) took 216 ms whole, 355 ms partitioned by chat, and 57 ms
over a plain scan of the float vectors. They need the sqlite-vec extension loaded on each connection
(webapp.extensions); without it, search is by words only.
"""

import json

import numpy as np
import snowballstemmer
import sqlalchemy as sa

from webapp.extensions import db
from webapp.search.terms import Match, informative

VECTOR_TABLES = {
    "memory": ("memory_vectors", "memory_id", "agent_id"),
    "message": ("message_vectors", "message_id", "chat_id"),
}
# Index entries ANALYZE reads of each index (refresh_term_stats): an estimate, in under a second at 1M rows.
ANALYSIS_LIMIT = 1000


def lexical(model: type, words: list[str], match: Match, scope: tuple) -> sa.Select:
    """(id, rank) of the matching rows within the scope (lower rank is better)."""
    if match is Match.ANY_WORD:
        if len(words) > 1:  # one word is searched by, however common
            words = informative(words, *_documents(model.__tablename__, words))
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
    return statement


def _documents(table: str, words: list[str]) -> tuple[int, dict[str, int]]:
    """About how many rows the table has (its highest id), and how many hold each word: from the vocabulary of
    its full-text index (migration b7d9f1a3c5e7), which holds each word as its Porter stem."""
    stemmer = snowballstemmer.stemmer("porter")  # one per call: a stemmer is not safe to share across threads
    stems = {word: stemmer.stemWord(word) for word in words}
    vocabulary = sa.table(f"{table}_fts_vocab", sa.column("term"), sa.column("doc"))
    # One statement: the words' rows, and the highest id as a row of no word.
    highest = sa.select(sa.null(), sa.func.max(sa.column("id"))).select_from(sa.table(table))
    held = dict(
        db.session.execute(
            sa.union_all(sa.select(vocabulary).where(vocabulary.c.term.in_(set(stems.values()))), highest)
        ).all()
    )
    rows = held.pop(None, None) or 0
    return rows, {word: held.get(stem, 0) for word, stem in stems.items()}


def among(column: sa.ColumnElement[int], ids: list[int] | str) -> sa.ColumnElement[bool]:
    """column IN the ids, bound as one parameter (a JSON array): a statement may hold only so many. `ids` may
    instead name the parameter, given the list when the statement is run (a statement built once)."""
    if isinstance(ids, str):
        bound = sa.bindparam(ids, type_=sa.JSON)
    else:
        bound = sa.bindparam("ids", json.dumps(ids), unique=True)
    each = sa.func.json_each(bound).table_valued("value")
    return column.in_(sa.select(each.c.value))


def in_query(column: sa.ColumnElement[int], ids: sa.Select) -> sa.ColumnElement[bool]:
    """column IN (the query of ids)."""
    return column.in_(ids)


def rebuild_lexical(tables: tuple[str, ...]) -> None:
    for table in tables:
        db.session.execute(sa.text(f"INSERT INTO {table}_fts({table}_fts) VALUES ('rebuild')"))


def refresh_term_stats() -> None:
    """FTS5 keeps its own word statistics; this refreshes the query planner's (ANALYZE). Without them SQLite
    guesses, and guessed wrong for the chats an agent may search: all the account's chats, each checked for the
    agent, instead of the agent's chats (6 ms against 0.3 ms with 10,000 chats, in every search; bench.recall)."""
    db.session.execute(sa.text(f"PRAGMA analysis_limit={ANALYSIS_LIMIT}"))
    db.session.execute(sa.text("ANALYZE"))


def vectors_available() -> bool:
    try:
        db.session.execute(sa.text("SELECT vec_version()"))
    except sa.exc.OperationalError:
        db.session.rollback()
        return False
    return True


def ensure_vector_tables(dimensions: int) -> None:
    """Nothing to make: the migration e2a4c6e8f0b2 made the vector tables (any dimensions: a vector is a float32
    blob, its model says what it is; a vector per row and model, as a row holds two while a new model's vectors
    are written, webapp.search.embedder). Made here at the first embedding, they changed the schema under the
    other connections, whose statements then failed."""


def vectors_held(agent_id: int) -> sa.ColumnElement[bool]:
    """Whether any of the agent's memories has a vector, as a column of a statement asked anyway (the migration
    made the tables)."""
    vectors = sa.table("memory_vectors", sa.column("agent_id"))
    return sa.exists().where(vectors.c.agent_id == agent_id)


def vector_dimensions() -> int | None:
    """The dimensions of the stored vectors, None when there are none (the migration made the tables)."""
    return db.session.scalar(
        sa.text(
            "SELECT length(embedding) / 4 FROM (SELECT embedding FROM memory_vectors LIMIT 1) "
            "UNION ALL SELECT length(embedding) / 4 FROM (SELECT embedding FROM message_vectors LIMIT 1) LIMIT 1"
        )
    )


def store_vectors(kind: str, rows: list[tuple[int, int, str, np.ndarray]]) -> None:
    """(id, owner id, model, vector) rows; a row already there is replaced."""
    table, key, owner = VECTOR_TABLES[kind]
    db.session.execute(
        sa.text(
            f"INSERT OR REPLACE INTO {table}({key}, {owner}, model, bits, embedding) "
            "VALUES (:id, :owner, :model, vec_quantize_binary(:v), :v)"
        ),
        [{"id": i, "owner": o, "model": m, "v": _blob(v)} for i, o, m, v in rows],
    )


def delete_vectors(kind: str, ids: list[int]) -> None:
    table, key, _owner = VECTOR_TABLES[kind]
    if ids:
        db.session.execute(
            sa.text(f"DELETE FROM {table} WHERE {key} IN ({','.join(map(str, map(int, ids)))})")
        )


def by_bits(
    kind: str, model: str, vector: np.ndarray, owners: list[int], admitted: sa.Select | None, n: int
) -> sa.Select:
    """The query of the ids of the n vectors of this model nearest to `vector` by the Hamming distance of their
    sign bits, among the owners' (an agent's memories, or the messages of some chats) and, if given, those
    `admitted` (a query of ids) holds: read from the owners' range of a covering index."""
    name, key, owner = VECTOR_TABLES[kind]
    table = sa.table(name, sa.column(key), sa.column(owner), sa.column("model"), sa.column("bits"))
    by_bits = sa.func.vec_distance_hamming(
        sa.func.vec_bit(table.c.bits), sa.func.vec_quantize_binary(_blob(vector))
    )
    statement = sa.select(table.c[key]).where(among(table.c[owner], owners), table.c.model == model)
    if admitted is not None:
        # "+key": the owners' range of the index is read, and each row in it checked against the admitted ids;
        # a plain `key IN` makes SQLite look each admitted id up instead (many more reads).
        statement = statement.where(sa.literal_column(f"+{name}.{key}").in_(admitted))
    return statement.order_by(by_bits).limit(n)


def by_distance(
    kind: str, model: str, vector: np.ndarray, candidates: sa.Select, admitted: sa.Select | None, k: int
) -> tuple[list[tuple[int, float]], int | None]:
    """(id, cosine distance) of the k vectors of this model of the `candidates` (a query of ids) nearest to
    `vector` whose ids `admitted` (a query of ids) holds, if given, nearest first; and how many candidates there
    were (None when none is admitted). The candidates are looked up by their keys."""
    name, key, _owner = VECTOR_TABLES[kind]
    table = sa.table(name, sa.column(key), sa.column("model"), sa.column("embedding"))
    distance = sa.func.vec_distance_cosine(table.c.embedding, _blob(vector)).label("distance")
    counted = sa.select(sa.func.count()).select_from(candidates.subquery()).scalar_subquery()
    statement = sa.select(table.c[key], distance, counted).where(
        in_query(table.c[key], candidates), table.c.model == model
    )
    if admitted is not None:
        # The scope checked by the candidates' keys (given the scope's query alone, a database reads all of an
        # agent's memories to check 200).
        statement = statement.where(
            table.c[key].in_(admitted.where(in_query(admitted.selected_columns[0], candidates)))
        )
    rows = db.session.execute(statement.order_by(distance).limit(k)).all()
    return [(row[0], row[1]) for row in rows], (rows[0][2] if rows else None)


def _blob(vector: np.ndarray) -> bytes:
    """A vector as sqlite-vec reads it: float32 bytes."""
    return np.asarray(vector, dtype=np.float32).tobytes()
