"""Recall query time over a large corpus: 100,000 memories and 1,000,000 messages.

    .venv/bin/python -m bench.recall                                   # SQLite (FTS5)
    BENCH_DATABASE_URL=postgresql+psycopg://... .venv/bin/python -m bench.recall   # PostgreSQL (tsvector, GIN)

100 agents with 1,000 memories each; 10,000 chats of 100 messages, each with two of the agents. The measured
agent takes part in about 200 chats. Prints the loading time, then for each query the SQL statements and the
best time of one recall (memories and messages, scoped to the agent); the target is under 50 ms.
BENCH_MEMORIES and BENCH_MESSAGES change the sizes.
"""

import os
import random
import time
from datetime import timedelta

import sqlalchemy as sa

from bench.common import bench_app, measure
from tests import factories
from webapp.extensions import db
from webapp.models import AgentMemory, Chat, ChatAgent, Message
from webapp.timeutil import utcnow
from webapp.tools import ToolContext
from webapp.tools.recall import recall

MEMORIES = int(os.environ.get("BENCH_MEMORIES", 100_000))
MESSAGES = int(os.environ.get("BENCH_MESSAGES", 1_000_000))
AGENTS, PER_CHAT, BATCH = 100, 100, 20_000
QUERIES = [
    "roses",
    "grandmother birthday cake",
    "zeppelin",
    "where did we leave the greenhouse key",
    "tulips frost",
]


PLACED = {
    "the": 1,
    "we": 8,
    "roses": 30,
    "tulips": 300,
    "frost": 500,
    "cake": 1_000,
    "birthday": 2_000,
    "grandmother": 3_000,
    "greenhouse": 4_000,
    "key": 600,
}  # fmt: skip  (Zipf rank of the queried words)


def _vocabulary(rng: random.Random) -> tuple[list[str], list[float]]:
    """About 5,000 made-up words and the queried ones, Zipf-weighted: a few are everywhere, most are rare."""
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vel", "do", "ra", "gin", "po", "che", "fa", "lu"]
    made = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) for _ in range(6_000)})
    rng.shuffle(made)
    for word, rank in sorted(PLACED.items(), key=lambda item: item[1]):
        made.insert(rank - 1, word)
    cumulative, total = [], 0.0
    for rank in range(len(made)):
        total += 1 / (rank + 1)
        cumulative.append(total)
    return made, cumulative


def _text(rng: random.Random, words: list[str], cumulative: list[float]) -> str:
    return " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(8, 20))).capitalize() + "."


def _insert(model, rows: list[dict]) -> None:
    db.session.execute(sa.insert(model), rows)
    db.session.commit()


def _load(rng: random.Random) -> tuple:
    account = factories.account()
    user = factories.user(account)
    agents = [factories.agent(account, f"Agent{i}") for i in range(AGENTS)]
    words, weights = _vocabulary(rng)
    now = utcnow()
    memories = [
        {"agent_id": agents[i % AGENTS].id, "content": _text(rng, words, weights), "memory_type": rng.choice(["core", "journal"]),
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
                         "content": _text(rng, words, weights), "created_at": now, "updated_at": now})  # fmt: skip
        if len(rows) >= BATCH:
            _insert(Message, rows)
            rows = []
    if rows:
        _insert(Message, rows)
    return agents[1], chats[1]


def main() -> None:
    with bench_app() as app:
        dialect = db.engine.dialect.name
        started = time.perf_counter()
        agent, chat = _load(random.Random(14))
        print(
            f"{dialect}: loaded {MEMORIES:,} memories and {MESSAGES:,} messages in {time.perf_counter() - started:.0f} s"
        )
        if dialect == "postgresql":
            db.session.execute(sa.text("ANALYZE"))
            db.session.commit()
        reply = factories.message(chat, "", author=agent, status="streaming")
        context = ToolContext(agent=agent, chat=chat, message=reply)
        print(f"{'query':<42} | {'results':>7} | {'queries':>7} | {'best ms':>7}")
        for query in QUERIES:
            found = len(recall(context, query)["results"])
            queries, ms = measure(lambda q=query: recall(context, q))
            print(f"{query:<42} | {found:>7} | {queries:>7} | {ms:>7.1f}")
        app.logger.info("done")


if __name__ == "__main__":
    main()
