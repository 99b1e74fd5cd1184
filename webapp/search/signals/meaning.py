"""Evidence by meaning: the query's embedding against the stored vectors (cosine similarity), weighted against
the words' and counted alone only when close enough; as measured on LoCoMo (bench/locomo.py)."""

import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import sqlalchemy as sa
from flask import Flask, current_app

from webapp.extensions import db
from webapp.models import AgentMemory
from webapp.search import embedder
from webapp.search.databases import backend
from webapp.search.signals import Evidence, Hits, Query

# Of the vector list's z-scores against the word list's. 1.5 since the date and the people a query names rank
# first (webapp.search.mentions): LoCoMo dev R@10 with memories 0.880 at 1, 0.878 at 1.2, 0.881 at 1.5 (open-domain
# 0.598 -> 0.623), 0.876 at 1.75, 0.873 at 2; without memories 0.855 at 1, 0.858 at 1.5.
DENSE_WEIGHT = 1.5
MIN_SIMILARITY = 0.25  # a row found by meaning alone must be at least this close (cosine)
RESCORED = 4  # candidates by sign bits per vector found, ranked again by their exact distance


def _dense_meanwhile(query: Query) -> Callable[[], Hits]:
    """What gives _dense's rows for the query's vector once embedded (none without one). While the database pool
    has a connection to spare, they are searched on a thread and a connection of their own as the caller searches
    by words (on PostgreSQL the two took 16 and 22 ms of a recall; bench.recall), and so read what is committed.
    Otherwise (a process with one connection, SQLite under gevent; a busy pool) on the caller's, once asked for:
    a search asks for a second connection only when the pool has one free. With query.meanwhile False, on the
    caller's connection in any case."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    if query.vector is None:
        return list
    if not query.meanwhile or not _connection_to_spare():
        return functools.partial(_dense_of, None, query)
    return _dense_threads.submit(_dense_of, app, query).result


EVIDENCE = Evidence("meaning", _dense_meanwhile, DENSE_WEIGHT, alone_at_least=MIN_SIMILARITY)


def _connection_to_spare() -> bool:
    pool = db.engine.pool
    return isinstance(pool, sa.pool.QueuePool) and pool.checkedout() < pool.size()


_dense_threads = ThreadPoolExecutor(max_workers=8, thread_name_prefix="vector-search")


def _dense_of(app: Flask | None, query: Query) -> Hits:
    """_dense once the vector is there; in an app context (and so a session) of its own when given the app."""
    embedding = query.vector.result()
    if embedding is None:
        return []
    if app is None:
        return _dense(query, embedding)
    with app.app_context():
        return _dense(query, embedding)


def _dense(query: Query, vector: np.ndarray) -> Hits:
    """(id, cosine similarity) of the rows nearest to the vector among the query's owners' and within its scope,
    nearest first. Only the readable turns have vectors (webapp.search.indexing), so a search of messages is
    scoped by its chats alone."""
    admitted = sa.select(AgentMemory.id).where(*query.scope) if query.kind == "memory" else None
    found = nearest(query.kind, vector, query.owners, admitted, query.candidates)
    return [(i, 1.0 - distance) for i, distance in found]


def nearest(
    kind: str, vector: np.ndarray, owners: list[int], admitted: sa.Select | None, k: int
) -> list[tuple[int, float]]:
    """(id, cosine distance) of the k vectors ("memory" or "message") of the configured embedder nearest to
    `vector` among the owners' whose ids `admitted` (a query of ids; None: all) holds, nearest first.

    The nearest RESCORED * k by their sign bits among the owners' are ranked by their exact distance, those
    admitted only, in one statement. Most of an agent's rows are admitted anywhere; when fewer than k of those
    candidates are, and they were all RESCORED * k (or none was admitted), the nearest by bits among the
    admitted are taken instead: a longer search, as it reads the scope of every row (an agent's 10,000
    memories: 7 ms against 2 on SQLite, 15 against 5 on PostgreSQL; bench.prompt_memory)."""
    # The vectors of the model that embedded the query (its account's searched one; embedder.embed).
    database, model, n = backend(), embedder.model_of(vector), RESCORED * k
    # One statement: the candidates are a CTE, read once whatever refers to them.
    candidates = database.by_bits(kind, model, vector, owners, None, n).cte("candidates")
    keys = sa.select(candidates.c[0])
    # Each database checks the candidates against the scope its own way (by_distance).
    found, count = database.by_distance(kind, model, vector, keys, admitted, k)
    if admitted is not None and len(found) < k and count in (None, n):
        candidates = database.by_bits(kind, model, vector, owners, admitted, n).cte("candidates")
        found, _count = database.by_distance(kind, model, vector, sa.select(candidates.c[0]), None, k)
    return found
