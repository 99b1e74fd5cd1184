"""Shared set-up for benchmarks: a migrated database, an app wired to fakeredis, a signed-in client."""

import contextlib
import os
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
def bench_app(database_url: str | None = None) -> Iterator[Flask]:
    """A fresh app and database (a temporary SQLite file unless BENCH_DATABASE_URL or database_url is given)."""
    with tempfile.TemporaryDirectory() as tmp:
        url = database_url or os.environ.get("BENCH_DATABASE_URL") or f"sqlite:///{tmp}/bench.db"
        app = create_app({"SQLALCHEMY_DATABASE_URI": url, "WTF_CSRF_ENABLED": False, "SECRET_KEY": "bench"})
        connection = fakeredis.FakeRedis()
        app.extensions["redis"] = connection
        app.extensions["rq_queue"] = Queue(app.config["RQ_QUEUE"], connection=connection)
        with app.app_context():
            if db.engine.dialect.name == "postgresql":  # start from an empty schema every time
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
