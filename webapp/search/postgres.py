"""Search on PostgreSQL: BM25 over tsvector for words, pgvector (HNSW) for vectors.

Words: the generated `search_vector` columns with GIN indexes (migration 680a29028759) find the candidates;
they are ranked by Okapi BM25 in SQL. PostgreSQL's own ts_rank_cd ignores how rare a word is, and Debian has
no BM25 extension, so the statistics BM25 needs (how many rows hold each word, the rows' mean length) are
kept in the tables `search_term_stats` and `search_table_stats`, refreshed from the index by
refresh_term_stats (hourly, and by `flask memories reindex`). A term's frequency in a row is ts_rank_cd with
unit weights over that term alone; a row's length is its number of distinct words.

Vectors: the tables `memory_vectors` and `message_vectors` (pgvector's `vector`, of any dimensions, the model
that wrote it, and its sign bits from binary_quantize), with a covering index of (owner, model) that includes
the bits. A search reads the owners' range of that index only (an agent's memories, the messages of its
chats), takes the nearest by Hamming distance and ranks those by their exact cosine distance, as on SQLite.
An HNSW index does not serve these scoped searches: measured with 200,000 vectors and a scope of 20,000, it
returned 7 of 50 rows (the scope filters its candidates after the scan), 74 ms with pgvector's iterative scan,
and the exact scan of the scope took 50 ms. The tables need the pgvector extension; they are made at first use
(CREATE EXTENSION needs the right to), otherwise search is by words.
"""

import functools
import math

import numpy as np
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from webapp.extensions import db
from webapp.search.terms import Match, informative

K1 = 1.2
B = 0.75
TABLES = ("agent_memories", "messages")
VECTOR_TABLES = {
    "memory": ("memory_vectors", "memory_id", "agent_id", "agent_memories"),
    "message": ("message_vectors", "message_id", "chat_id", "messages"),
}


def lexical(model: type, words: list[str], match: Match, scope: tuple) -> sa.Select:
    """(id, rank) of the matching rows within the scope (lower rank is better). On the table itself, so
    PostgreSQL can combine the GIN index with the scope's own indexes."""
    table = model.__tablename__
    search_vector = sa.literal_column(f"{table}.search_vector")
    if match is Match.ALL_PREFIXES:
        tsquery = sa.func.to_tsquery("english", " & ".join(f"{w}:*" for w in words))
        rank = -sa.func.ts_rank_cd(search_vector, tsquery)
        return sa.select(model.id, rank.label("rank")).where(search_vector.op("@@")(tsquery), *scope)
    rows, mean_length, documents = _statistics(table, words)
    words = informative(words, rows, documents)
    tsquery = sa.func.to_tsquery("english", " | ".join(words))
    return _bm25(
        sa.select(model.id).where(search_vector.op("@@")(tsquery), *scope),
        search_vector,
        rows,
        mean_length,
        {w: documents.get(w, 0) for w in words},
    )


def _bm25(
    matches: sa.Select,
    search_vector: sa.ColumnElement,
    rows: int,
    mean_length: float,
    documents: dict[str, int],
) -> sa.Select:
    """(id, rank) of the matches (a query of ids), ranked by Okapi BM25 for these words from the kept
    statistics: the table's rows and their mean length, and how many rows hold each word (lower is better).
    Each word's frequency in a row is read once, under a fence (OFFSET 0) that keeps PostgreSQL from writing
    it twice into the formula: it computed each twice, half of a search's 38 ms (bench.prompt_memory)."""
    frequencies, score = _bm25_sql(len(documents), search_vector.name)
    words = [_bound(f"word_{n}", word) for n, word in enumerate(documents)]
    counted = matches.add_columns(sa.text(frequencies).bindparams(*words)).offset(0).subquery("counted")
    weights = [
        _bound(f"idf_{n}", math.log(1 + (rows - held + 0.5) / (held + 0.5)))
        for n, held in enumerate(documents.values())
    ]
    lengths = [_bound("flat", K1 * (1 - B)), _bound("per_length", K1 * B / mean_length)]
    rank = sa.type_coerce(sa.text(score).bindparams(*weights, *lengths), sa.Float).label("rank")
    return sa.select(counted.c.id, rank)


@functools.cache
def _bm25_sql(words: int, search_vector: str) -> tuple[str, str]:
    """The SQL of BM25 for a number of words, written once, its values bound: each word's frequency in a row
    (the columns tf_0... and the row's length) and the rank from them. Built of SQLAlchemy expressions at each
    search, they took 4 of its 7 ms of Python (bench.recall)."""
    frequencies = [
        f"ts_rank_cd('{{1,1,1,1}}'::float4[], {search_vector}, to_tsquery('english', :word_{n}), 0) AS tf_{n}"
        for n in range(words)
    ]
    length_norm = "(:flat + :per_length * counted.length)"
    score = [f":idf_{n} * counted.tf_{n} * {K1 + 1} / (counted.tf_{n} + {length_norm})" for n in range(words)]
    return ", ".join([*frequencies, f"length({search_vector}) AS length"]), f"-({' + '.join(score)})"


def _bound(name: str, value: object) -> sa.BindParameter:
    return sa.bindparam(name, value, unique=True)


def among(column: sa.ColumnElement[int], ids: list[int] | str) -> sa.ColumnElement[bool]:
    """column = ANY(ids), the ids bound as one array: a statement may hold only so many parameters, and
    PostgreSQL plans `= ANY` knowing how many there are (`IN (SELECT unnest(...))` ran a search of the words'
    index once per chat: 200 times, 330 ms; bench.recall). `ids` may instead name the parameter, given the
    list when the statement is run (a statement built once)."""
    array = ARRAY(sa.Integer)
    if isinstance(ids, str):
        return column == sa.any_(sa.bindparam(ids, type_=array))
    return column == sa.any_(sa.bindparam("ids", ids, type_=array, unique=True))


def in_query(column: sa.ColumnElement[int], ids: sa.Select) -> sa.ColumnElement[bool]:
    """column = ANY(ARRAY(the query of ids)): the ids are read first, then each row is looked up by them. Joined
    instead, PostgreSQL read every chat of the account to keep an agent's 200 (4 ms against 0.5; bench.recall)."""
    return column == sa.any_(sa.func.array(ids.scalar_subquery()))


def _statistics(table: str, words: list[str]) -> tuple[int, float, dict[str, int]]:
    """(rows, mean length, rows holding each word) of the table, as last refreshed."""
    result = db.session.execute(
        sa.text(
            "SELECT w.word, coalesce(t.docs, 0), coalesce(s.docs, 0), coalesce(s.mean_length, 1) "
            "FROM unnest(CAST(:words AS text[])) AS w(word) "
            "LEFT JOIN search_table_stats s ON s.table_name = :table "
            "LEFT JOIN search_term_stats t ON t.table_name = :table "
            "AND t.term = array_to_string(tsvector_to_array(to_tsvector('english', w.word)), ' ')"
        ),
        {"words": words, "table": table},
    ).all()
    rows = max((r[2] for r in result), default=0)
    mean_length = max((r[3] for r in result), default=1.0) or 1.0
    return rows, float(mean_length), {r[0]: r[1] for r in result}


def rebuild_lexical(tables: tuple[str, ...]) -> None:
    for table in tables:
        db.session.execute(sa.text(f"REINDEX INDEX ix_{table}_search_vector"))


def refresh_term_stats() -> None:
    """Count, from each table's search index, how many rows hold each word, and the rows' mean length."""
    for table in TABLES:
        db.session.execute(sa.text("DELETE FROM search_term_stats WHERE table_name = :t"), {"t": table})
        db.session.execute(
            sa.text(
                "INSERT INTO search_term_stats(table_name, term, docs) "
                f"SELECT :t, word, ndoc FROM ts_stat('SELECT search_vector FROM {table}')"
            ),
            {"t": table},
        )
        db.session.execute(sa.text("DELETE FROM search_table_stats WHERE table_name = :t"), {"t": table})
        db.session.execute(
            sa.text(
                "INSERT INTO search_table_stats(table_name, docs, mean_length) "
                f"SELECT :t, count(*), coalesce(avg(length(search_vector)), 1) FROM {table}"
            ),
            {"t": table},
        )


def vectors_available() -> bool:
    """pgvector is installed in this database (made so here when the role may)."""
    if db.session.scalar(sa.text("SELECT 1 FROM pg_extension WHERE extname = 'vector'")):
        return True
    try:
        with db.session.begin_nested():
            db.session.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
    except sa.exc.DBAPIError:
        return False
    return True


def ensure_vector_tables(dimensions: int) -> None:
    """The vector tables (any dimensions: each vector's model says what it is; a vector per row and model, as a
    row holds two while a new model's vectors are written), under a covering index of (owner, model) with each
    vector's sign bits. pgvector must be available."""
    db.session.execute(sa.text("CREATE EXTENSION IF NOT EXISTS vector"))
    for table, key, owner, rows in VECTOR_TABLES.values():
        db.session.execute(
            sa.text(
                f"CREATE TABLE IF NOT EXISTS {table} ({key} integer NOT NULL REFERENCES {rows}(id) "
                f"ON DELETE CASCADE, {owner} integer NOT NULL, model text NOT NULL, embedding vector NOT NULL, "
                f"bits varbit NOT NULL, PRIMARY KEY ({key}, model))"
            )
        )
        db.session.execute(
            sa.text(
                f"CREATE INDEX IF NOT EXISTS ix_{table}_scan ON {table} ({owner}, model) INCLUDE (bits, {key})"
            )
        )


def vectors_held(agent_id: int) -> sa.ColumnElement[bool]:
    """Whether the agent's memories may have vectors, as a column of a statement asked anyway: the vector tables
    exist (made at the first embedding, they may not be named before; never dropped)."""
    return sa.func.to_regclass("memory_vectors").is_not(None)


def vector_dimensions() -> int | None:
    exists = db.session.scalar(sa.text("SELECT to_regclass('memory_vectors') IS NOT NULL"))
    if not exists:
        return None
    return db.session.scalar(
        sa.text(
            "SELECT vector_dims(embedding) FROM (SELECT embedding FROM memory_vectors LIMIT 1) m "
            "UNION ALL SELECT vector_dims(embedding) FROM (SELECT embedding FROM message_vectors LIMIT 1) n LIMIT 1"
        )
    )


def store_vectors(kind: str, rows: list[tuple[int, int, str, np.ndarray]]) -> None:
    """(id, owner id, model, vector) rows; a row already there is replaced."""
    table, key, owner, _rows = VECTOR_TABLES[kind]
    db.session.execute(
        sa.text(
            f"INSERT INTO {table}({key}, {owner}, model, embedding, bits) "
            "VALUES (:id, :owner, :model, CAST(:v AS vector), binary_quantize(CAST(:v AS vector))) "
            f"ON CONFLICT ({key}, model) DO UPDATE SET {owner} = excluded.{owner}, "
            "embedding = excluded.embedding, bits = excluded.bits"
        ),
        [{"id": i, "owner": o, "model": m, "v": _literal(v)} for i, o, m, v in rows],
    )


def delete_vectors(kind: str, ids: list[int]) -> None:
    table, key, _owner, _rows = VECTOR_TABLES[kind]
    if ids:
        db.session.execute(sa.text(f"DELETE FROM {table} WHERE {key} = ANY(:ids)"), {"ids": list(ids)})


def by_bits(
    kind: str, model: str, vector: np.ndarray, owners: list[int], admitted: sa.Select | None, n: int
) -> sa.Select:
    """The query of the ids of the n vectors of this model nearest to `vector` by the Hamming distance of their
    sign bits, among the owners' (an agent's memories, or the messages of some chats) and, if given, those
    `admitted` (a query of ids) holds: an index-only scan of the owners' range."""
    name, key, owner, _rows = VECTOR_TABLES[kind]
    table = sa.table(name, sa.column(key), sa.column(owner), sa.column("model"), sa.column("bits"))
    by_bits = table.c.bits.op("<~>")(sa.func.binary_quantize(_query_vector(vector)))
    statement = sa.select(table.c[key]).where(among(table.c[owner], owners), table.c.model == model)
    if admitted is not None:
        statement = statement.where(table.c[key].in_(admitted))
    return statement.order_by(by_bits).limit(n)


def by_distance(
    kind: str, model: str, vector: np.ndarray, candidates: sa.Select, admitted: sa.Select | None, k: int
) -> tuple[list[tuple[int, float]], int | None]:
    """(id, cosine distance) of the k vectors of this model of the `candidates` (a query of ids) nearest to
    `vector` whose ids `admitted` (a query of ids) holds, if given, nearest first; and how many candidates there
    were (None when none is admitted). The candidates are looked up by their keys."""
    name, key, _owner, _rows = VECTOR_TABLES[kind]
    table = sa.table(name, sa.column(key), sa.column("model"))
    distance = sa.literal_column(f"{name}.embedding").op("<=>")(_query_vector(vector))
    counted = sa.select(sa.func.count()).select_from(candidates.subquery()).scalar_subquery()
    if admitted is not None:
        # The admitted ids among the candidates, read once: checked by a correlated EXISTS, PostgreSQL without
        # statistics yet (a table just written) read the agent's memories once per candidate (200 x 100 rows:
        # 7 ms of a prompt, against 1; bench.job_overhead --memories 200), and as `key IN (...)`, misjudging how
        # few rows the scope holds, it joined by such a loop.
        candidates = admitted.where(in_query(admitted.selected_columns[0], candidates))
    statement = sa.select(table.c[key], distance.label("distance"), counted).where(
        in_query(table.c[key], candidates), table.c.model == model
    )
    rows = db.session.execute(statement.order_by(sa.literal_column("distance")).limit(k)).all()
    return [(row[0], row[1]) for row in rows], (rows[0][2] if rows else None)


def _query_vector(vector: np.ndarray) -> sa.TextClause:
    text = _query_literal(np.asarray(vector, dtype=np.float32).tobytes())
    return sa.text("CAST(:query_vector AS vector)").bindparams(query_vector=text)


@functools.lru_cache(maxsize=8)
def _query_literal(data: bytes) -> str:
    """A query vector's literal, written once for the two to four places a search names it (0.5 ms each)."""
    return _literal(np.frombuffer(data, dtype=np.float32))


def _literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(vector, dtype=np.float32).tolist()) + "]"
