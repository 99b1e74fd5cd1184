"""Backup figures: `flask backup export` and `import` of an install with N messages (default 100,000; a million
works), their wall time, the file's size, and the peak memory of each (the process's resident memory above what
it held before, sampled every 20 ms; with --tracemalloc, Python's own allocations instead, which is slower).

    .venv/bin/python -m bench.backup [--messages 1000000] [--tracemalloc]
    BENCH_DATABASE_URL=postgresql+psycopg://... .venv/bin/python -m bench.backup

On PostgreSQL the one database is emptied, filled and exported, then emptied again and the file imported into
it. The import's rebuild of search (`flask memories reindex`, which embeds every message) is not timed here.
Prints figures; it asserts nothing.
"""

import argparse
import random
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import sqlalchemy as sa

from bench.common import bench_app
from tests import factories
from webapp.backup.export import export
from webapp.backup.restore import restore
from webapp.extensions import db
from webapp.models import Message
from webapp.timeutil import utcnow

BATCH = 20_000
CHATS = 1_000
WORDS = "the roses frost greenhouse we key cake tulips birthday grandmother said water soil spring".split()


def _fill(messages: int) -> None:
    """An account with a person, an agent and CHATS chats holding `messages` messages of 20 to 60 words."""
    account = factories.account()
    person = factories.user(account)
    agent = factories.agent(account, "Ada")
    chat_ids = [factories.chat(account, [agent], f"chat {n}").id for n in range(min(CHATS, messages) or 1)]
    rng, now = random.Random(7), utcnow()
    for start in range(0, messages, BATCH):
        rows = [
            {"chat_id": chat_ids[n % len(chat_ids)], "role": "user", "user_id": person.id, "status": "done",
             "content": " ".join(rng.choices(WORDS, k=rng.randint(20, 60))), "created_at": now, "updated_at": now}
            for n in range(start, min(messages, start + BATCH))
        ]  # fmt: skip
        db.session.execute(sa.insert(Message), rows)
        db.session.commit()


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def _measured(func, traced: bool) -> tuple[float, int]:
    """(wall seconds, peak bytes above the start) of func()."""
    if traced:
        tracemalloc.start()
        started = time.perf_counter()
        func()
        took, peak = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return took, peak
    before, peak, done = _resident(), [0], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _resident() - before)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        func()
    finally:
        took = time.perf_counter() - started
        done.set()
        sampler.join()
    return took, max(peak[0], _resident() - before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--tracemalloc", action="store_true", help="Peak of Python's allocations (slower).")
    args = parser.parse_args()
    kind = "Python allocations" if args.tracemalloc else "resident memory"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cairn.backup"
        with bench_app():
            started = time.perf_counter()
            _fill(args.messages)
            print(f"filled {args.messages:,} messages on {db.engine.dialect.name} in "
                  f"{time.perf_counter() - started:.1f} s")  # fmt: skip
            took, peak = _measured(lambda: export(path), args.tracemalloc)
            print(f"export: {took:.1f} s, {args.messages / took:,.0f} messages/s, file {path.stat().st_size / 1e6:.1f} "
                  f"MB, peak {kind} +{peak / 1e6:.1f} MB")  # fmt: skip
        with bench_app():
            took, peak = _measured(lambda: restore(path), args.tracemalloc)
            print(
                f"import: {took:.1f} s, {args.messages / took:,.0f} messages/s, peak {kind} +{peak / 1e6:.1f} MB"
            )


if __name__ == "__main__":
    main()
