"""Recall query time over a large corpus: 100,000 memories and 1,000,000 messages, each with a vector.

    .venv/bin/python -m bench.recall                                   # SQLite (FTS5, sqlite-vec)
    BENCH_DATABASE_URL=postgresql+psycopg://... .venv/bin/python -m bench.recall   # PostgreSQL (BM25, pgvector)

100 agents with 1,000 memories each; 10,000 chats of 100 messages, each with two of the agents. The measured
agent takes part in about 200 chats. Every row gets a random unit vector of the local embedder's 384
dimensions (the time of a search does not depend on what the vectors mean); the query is embedded for real.
Prints the loading time, then for each query the SQL statements and the p50 and p95 of one recall (memories
and messages, scoped to the agent) by words and meaning fused, and by words only. Targets: p95 under 80 ms
fused, under 50 ms by words. BENCH_MEMORIES and BENCH_MESSAGES change the sizes, BENCH_RUNS the runs per query.

Loading takes a while (half an hour for SQLite here). With BENCH_REUSE=1 and BENCH_DATABASE_URL naming a database
an earlier run loaded (say sqlite:////tmp/recall.db), the database is searched as it is: brought to the latest
migration, its statistics refreshed, and nothing loaded again.
"""

import os
import random
import time
from datetime import timedelta

import numpy as np
import sqlalchemy as sa

from bench.common import bench_app, zipf_text, zipf_vocabulary
from tests import factories
from tests.querycount import count_queries
from webapp import search
from webapp.extensions import db
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, Message
from webapp.runtime import set_loaded_aside
from webapp.search import embedder
from webapp.timeutil import utcnow
from webapp.tools import ToolContext
from webapp.tools.recall import recall

MEMORIES = int(os.environ.get("BENCH_MEMORIES", 100_000))
MESSAGES = int(os.environ.get("BENCH_MESSAGES", 1_000_000))
AGENTS, PER_CHAT, BATCH = 100, 100, 20_000
DIMENSIONS = 384
RUNS = int(os.environ.get("BENCH_RUNS", 20))
REUSE = os.environ.get("BENCH_REUSE") == "1"
QUERIES = [
    "roses",
    "grandmother birthday cake",
    "zeppelin",
    "where did we leave the greenhouse key",
    "tulips frost",
]


def _insert(model, rows: list[dict]) -> None:
    db.session.execute(sa.insert(model), rows)
    db.session.commit()


def _load(rng: random.Random) -> tuple:
    account = factories.account()
    user = factories.user(account)
    agents = [factories.agent(account, f"Agent{i}") for i in range(AGENTS)]
    words, weights = zipf_vocabulary(rng)
    now = utcnow()
    memories = [
        {"agent_id": agents[i % AGENTS].id, "content": zipf_text(rng, words, weights), "memory_type": rng.choice(["core", "journal"]),
         "constitutional": False, "created_at": now - timedelta(days=rng.randint(0, 90)), "updated_at": now}
        for i in range(MEMORIES)
    ]  # fmt: skip
    for start in range(0, len(memories), BATCH):
        _insert(AgentMemory, memories[start : start + BATCH])
    chats = [Chat(account_id=account.id, title=f"Chat {i}") for i in range(MESSAGES // PER_CHAT)]
    db.session.add_all(chats)
    db.session.commit()
    links = [
        {"chat_id": c.id, "agent_id": agents[(i * k) % AGENTS].id}
        for i, c in enumerate(chats)
        for k in (1, 3)
    ]
    _insert(ChatAgent, list({(r["chat_id"], r["agent_id"]): r for r in links}.values()))
    rows: list[dict] = []
    for chat in chats:
        for _ in range(PER_CHAT):
            rows.append({"chat_id": chat.id, "role": "user", "user_id": user.id, "status": "done",
                         "content": zipf_text(rng, words, weights), "created_at": now, "updated_at": now})  # fmt: skip
        if len(rows) >= BATCH:
            _insert(Message, rows)
            rows = []
    if rows:
        _insert(Message, rows)
    return agents[1], chats[1]


def _load_vectors(rng: np.random.Generator) -> None:
    """A random unit vector for every memory and message, written in batches."""
    search.backend().ensure_vector_tables(DIMENSIONS)
    db.session.commit()
    model = embedder.model_name()
    for kind, model_class, owner in (
        ("memory", AgentMemory, AgentMemory.agent_id),
        ("message", Message, Message.chat_id),
    ):
        rows = db.session.execute(sa.select(model_class.id, owner).order_by(model_class.id)).all()
        for start in range(0, len(rows), BATCH):
            batch = rows[start : start + BATCH]
            vectors = rng.standard_normal((len(batch), DIMENSIONS)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            search.backend().store_vectors(
                kind, [(i, o, model, v) for (i, o), v in zip(batch, vectors, strict=True)]
            )
            db.session.commit()


def _timed(func) -> tuple[int, float, float]:
    """(SQL statements, p50 ms, p95 ms) of RUNS calls of func()."""
    times = []
    for _ in range(RUNS):
        with count_queries() as counted:
            started = time.perf_counter()
            func()
            times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return counted.count, times[len(times) // 2], times[int(len(times) * 0.95) - 1]


def _loaded() -> tuple:
    """The measured agent and chat of a database an earlier run loaded (each the second made, as in _load)."""
    agent = db.session.scalars(sa.select(Agent).order_by(Agent.id).offset(1)).first()
    chat = db.session.scalars(sa.select(Chat).order_by(Chat.id).offset(1)).first()
    if agent is None or chat is None:
        raise SystemExit("BENCH_REUSE=1: the database at BENCH_DATABASE_URL holds no data of this bench")
    return agent, chat


def main() -> None:
    with bench_app(reuse=REUSE) as app:
        dialect = db.engine.dialect.name
        started = time.perf_counter()
        if REUSE:
            agent, chat = _loaded()
        else:
            agent, chat = _load(random.Random(14))
            loaded_in = time.perf_counter() - started
            print(f"{dialect}: loaded {MEMORIES:,} memories and {MESSAGES:,} messages in {loaded_in:.0f} s")
            started = time.perf_counter()
            _load_vectors(np.random.default_rng(14))
        search.backend().refresh_term_stats()
        db.session.commit()
        print(f"{dialect}: the vectors and the search statistics, in {time.perf_counter() - started:.0f} s")
        if dialect == "postgresql":
            db.session.execute(sa.text("ANALYZE"))
            db.session.commit()
        set_loaded_aside()  # as the worker does: no full collection of the loaded modules is timed
        reply = factories.message(chat, "", author=agent, status="streaming")
        context = ToolContext(agent=agent, chat=chat, message=reply)
        embed_query = search.query_vector
        print(
            f"{'query':<42} | {'search':<6} | {'results':>7} | {'queries':>7} | {'p50 ms':>7} | {'p95 ms':>7}"
        )
        for query in QUERIES:
            for mode in ("fused", "words"):
                search.query_vector = embed_query if mode == "fused" else (lambda *a, **k: None)
                found = len(recall(context, query)["results"])
                queries, p50, p95 = _timed(lambda q=query: recall(context, q))
                print(f"{query:<42} | {mode:<6} | {found:>7} | {queries:>7} | {p50:>7.1f} | {p95:>7.1f}")
        search.query_vector = embed_query
        app.logger.info("done")


if __name__ == "__main__":
    main()
