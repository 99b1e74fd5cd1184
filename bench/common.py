"""Shared set-up for benchmarks: a migrated database, an app wired to fakeredis, a signed-in client; made-up text
with the word frequencies of a real language."""

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Iterator

import fakeredis
import sqlalchemy as sa
from flask import Flask
from flask_migrate import upgrade
from rq import Queue

from tests.querycount import count_queries
from webapp.extensions import db
from webapp.factory import create_app


@contextlib.contextmanager
def bench_app(database_url: str | None = None, *, reuse: bool = False) -> Iterator[Flask]:
    """A fresh app and database (a temporary SQLite file unless BENCH_DATABASE_URL or database_url is given);
    with reuse, the database given as it is (brought to the latest migration)."""
    with tempfile.TemporaryDirectory() as tmp:
        url = database_url or os.environ.get("BENCH_DATABASE_URL") or f"sqlite:///{tmp}/bench.db"
        app = create_app({"SQLALCHEMY_DATABASE_URI": url, "WTF_CSRF_ENABLED": False, "SECRET_KEY": "bench"})
        connection = fakeredis.FakeRedis()
        app.extensions["redis"] = connection
        app.extensions["rq_queue"] = Queue(app.config["RQ_QUEUE"], connection=connection)
        with app.app_context():
            if db.engine.dialect.name == "postgresql" and not reuse:  # start from an empty schema every time
                with db.engine.begin() as conn:
                    conn.execute(sa.text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
            upgrade()
            yield app
            db.session.remove()
            db.engine.dispose()


def measure(func, repeat: int = 5) -> tuple[int, float]:
    """(SQL statements, best wall time in ms) of calling func()."""
    best = float("inf")
    queries = 0
    for _ in range(repeat):
        with count_queries() as counted:
            started = time.perf_counter()
            func()
            best = min(best, (time.perf_counter() - started) * 1000)
        queries = counted.count
    return queries, best


# The queried words of bench.recall and bench.prompt_memory, placed at these ranks of a Zipf vocabulary.
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


def zipf_vocabulary(rng: random.Random) -> tuple[list[str], list[float]]:
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


def zipf_text(rng: random.Random, words: list[str], cumulative: list[float]) -> str:
    """A sentence of 8 to 20 words drawn from a zipf_vocabulary."""
    return " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(8, 20))).capitalize() + "."
