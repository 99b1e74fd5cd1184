"""Queries and server time of "What agents remember of me" (/account/memories) as a person's memories grow.

    .venv/bin/python -m bench.remembered_page            # SQLite; BENCH_DATABASE_URL=postgresql://... for PostgreSQL

Prints one row per count of memories drawn from the person's chats (100, 1,000 and 10,000, across 3 agents and 5
chats, each with a source turn, beside as many of another person's): the first page's statements and best time,
and the count the "Forget everything" question shows. Statements must not grow with the memories.
"""

import sqlalchemy as sa

from bench.common import bench_app, measure
from tests import factories
from webapp.extensions import db
from webapp.models import AgentMemory, MemorySource
from webapp.timeutil import utcnow

SIZES = [100, 1_000, 10_000]


def _memories(agents, chats, said, count: int) -> None:
    now = utcnow()
    rows = [
        {
            "agent_id": agents[n % len(agents)].id,
            "content": f"Note {n}: the person mentioned their roses, bikes and tea on day {n % 28 + 1}.",
            "memory_type": "core" if n % 2 else "journal",
            "audience": "chat",
            "chat_id": chats[n % len(chats)].id,
            "created_at": now,
            "updated_at": now,
        }
        for n in range(count)
    ]
    db.session.execute(sa.insert(AgentMemory), rows)
    ids = db.session.scalars(sa.select(AgentMemory.id).order_by(AgentMemory.id)).all()[-count:]
    sources = [
        {"memory_id": memory_id, "message_id": said[n % len(said)].id} for n, memory_id in enumerate(ids)
    ]
    db.session.execute(sa.insert(MemorySource), sources)
    db.session.commit()


def _row(size: int) -> str:
    with bench_app() as app:
        acme = factories.account()
        milo, ana = (
            factories.user(acme, "milo@example.com", "member"),
            factories.user(acme, "ana@example.com", "member"),
        )
        agents = [factories.agent(acme, name) for name in ("Ada", "Basil", "Cleo")]
        mine = [factories.chat(acme, [agents[n % 3]], f"Chat {n}", people=[milo]) for n in range(5)]
        theirs = [factories.chat(acme, [agents[0]], "Ana's", people=[ana])]
        _memories(agents, mine, [factories.message(c, "About roses.", author=milo) for c in mine], size)
        _memories(agents, theirs, [factories.message(theirs[0], "About tulips.", author=ana)], size)
        client = app.test_client()
        client.post("/login", data={"email": milo.email, "password": factories.PASSWORD})

        def first_page() -> None:
            assert client.get("/account/memories").status_code == 200
            db.session.expire_all()

        def question() -> None:
            assert client.get("/account/memories/forget-all").status_code == 200
            db.session.expire_all()

        page_queries, page_ms = measure(first_page)
        ask_queries, ask_ms = measure(question)
    return f"{size:>9,} | {page_queries:>12} | {page_ms:>8.1f} | {ask_queries:>15} | {ask_ms:>8.1f}"


def main() -> None:
    print(
        f"{'memories':>9} | {'page queries':>12} | {'page ms':>8} | {'forget? queries':>15} | {'forget? ms':>8}"
    )
    for size in SIZES:
        print(_row(size))


if __name__ == "__main__":
    main()
