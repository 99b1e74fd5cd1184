"""Consolidation figures: the hourly finder's query time on a large database, and one chat's wall time with
several agents against a fake model of fixed latency, beside the time one-after-another would take.

    .venv/bin/python -m bench.consolidation [--chats 100000] [--messages 1000000] [--latency 0.5]
    BENCH_DATABASE_URL=postgresql+psycopg://... .venv/bin/python -m bench.consolidation

Prints figures; it asserts nothing.
"""

import argparse
import json
import random
import time
from datetime import timedelta

import sqlalchemy as sa

from bench.common import bench_app
from tests import factories
from tests.fake_llm import FakeLLM
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat, stale_chats_query
from webapp.models import Chat, Message
from webapp.timeutil import utcnow

BATCH = 20_000


def _fill(chats: int, messages: int) -> None:
    """`chats` chats (half of them group chats) with `messages` messages spread over the last two days."""
    account = factories.account()
    user = factories.user(account)
    now = utcnow()
    db.session.execute(
        sa.insert(Chat),
        [
            {"account_id": account.id, "title": f"chat {i}", "manual_responses": i % 2 == 0, "memory_doc": "",
             "created_at": now, "updated_at": now}
            for i in range(chats)
        ],
    )  # fmt: skip
    first_chat = db.session.scalar(sa.select(sa.func.min(Chat.id)))
    rng = random.Random(7)
    for start in range(0, messages, BATCH):
        rows = [
            {"chat_id": first_chat + rng.randrange(chats), "role": "user", "user_id": user.id, "content": "hello",
             "status": "done", "created_at": now - timedelta(minutes=rng.randrange(48 * 60)), "updated_at": now}
            for _ in range(min(BATCH, messages - start))
        ]  # fmt: skip
        db.session.execute(sa.insert(Message), rows)
    last = sa.select(sa.func.max(Message.created_at)).where(Message.chat_id == Chat.id).scalar_subquery()
    db.session.execute(sa.update(Chat).values(last_message_at=sa.func.coalesce(last, Chat.created_at)))
    db.session.commit()


def finder_figures(chats: int, messages: int) -> None:
    with bench_app() as app:
        started = time.perf_counter()
        _fill(chats, messages)
        print(f"filled {chats:,} chats and {messages:,} messages in {time.perf_counter() - started:.1f} s "
              f"({db.engine.dialect.name})")  # fmt: skip
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            found = db.session.scalars(stale_chats_query(utcnow(), timedelta(hours=6))).all()
            timings.append((time.perf_counter() - started) * 1000)
        print(f"finder: {len(found):,} stale chats found in {min(timings):.0f} ms (best of 3), one query")
        del app


def consolidation_figures(latency: float) -> None:
    fake = FakeLLM()
    fake.delay = latency
    fake.default_text = json.dumps({"journal": ["a fact"], "core": []})
    print(f"\nconsolidation of one chat, fake model latency {latency:.2f} s")
    print(f"{'agents':>6} | {'wall s':>7} | {'one after another s':>19} | {'speed-up':>8}")
    try:
        for count in (1, 5, 10):
            with bench_app() as app:
                # a provider (not a model that runs here, which answers one request at a time)
                app.config.update(
                    LLM_BASE_URL=fake.base_url,
                    LOCAL_LLM=False,
                    CONSOLIDATION_CONCURRENCY=10,
                    CONNECTION_CONCURRENCY=10,
                )
                account = factories.account()
                user = factories.user(account)
                agents = [factories.agent(account, f"Agent {i}") for i in range(count)]
                chat = factories.chat(account, agents, manual=True)
                factories.message(chat, "We agreed to plant tulips in March.", author=user)
                started = time.perf_counter()
                consolidate_chat(chat.id, force=True)
                wall = time.perf_counter() - started
                sequential = latency * count
                print(f"{count:>6} | {wall:>7.2f} | {sequential:>19.2f} | {sequential / wall:>7.1f}x")
    finally:
        fake.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chats", type=int, default=100_000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--latency", type=float, default=0.5)
    args = parser.parse_args()
    finder_figures(args.chats, args.messages)
    consolidation_figures(args.latency)


if __name__ == "__main__":
    main()
