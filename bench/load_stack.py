"""The production stack of README's Production section, on loopback, for the load benchmarks.

PostgreSQL (BENCH_DATABASE_URL, or the local cluster's cairn_bench_load database), a redis-server on a unix socket,
the fake model server of the tests (300 ms before its first token), gunicorn with threads for the pages,
gunicorn with gevent for the live streams, and RQ workers (`python worker.py`).
"""

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx  # the HTTP client the openai SDK brings
import sqlalchemy as sa
from flask import Flask
from flask_migrate import upgrade
from redis import Redis

from tests.conftest import free_port
from tests.fake_llm import FakeLLM
from webapp.extensions import db
from webapp.factory import create_app
from webapp.models import Account, Agent, Chat, ChatAgent, User
from webapp.runtime.processes import redis_server_argv

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PASSWORD = "bench password 1"
REPLY_TEXT = "Thanks for the message; here is a short answer of about twenty words, streamed word by word as models do."


@dataclass
class Stack:
    app: Flask  # in-process, on the same database and redis, to seed and audit
    pages: str  # base URL of the threaded gunicorn
    streams: str  # base URL of the gevent gunicorn serving /chats/<id>/stream
    llm: FakeLLM
    processes: list[subprocess.Popen] = field(default_factory=list)


def database_url(name: str = "cairn_bench_load") -> str:
    """BENCH_DATABASE_URL, or the local cluster's database `name` (created when missing)."""
    if os.environ.get("BENCH_DATABASE_URL"):
        return os.environ["BENCH_DATABASE_URL"]
    env = {**os.environ, "CAIRN_TEST_DB": name}
    return subprocess.run(
        [ROOT / "scripts/start-postgres.sh"], env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@contextlib.contextmanager
def running_stack(
    *, rq_workers: int = 2, model_latency: float = 0.3, extra_env: dict | None = None
) -> Iterator[Stack]:
    """Start everything on an empty database; stop every process on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        socket = Path(tmp) / "redis.sock"
        llm = FakeLLM()
        llm.delay, llm.chunk_delay, llm.default_text = model_latency, 0.005, REPLY_TEXT
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "REDIS_URL": f"unix://{socket}",
            "LLM_BASE_URL": llm.base_url,
            "SECRET_KEY": "bench",
            "INSTANCE_PATH": tmp,
            "DEFAULT_MODEL_ID": "fake-model",
            **(extra_env or {}),
        }
        processes = [subprocess.Popen(redis_server_argv(socket, tmp))]
        try:
            _wait(lambda: socket.exists() and Redis(unix_socket_path=str(socket)).ping(), "redis-server")
            app = _migrated_app(env)
            pages, streams = free_port(), free_port()
            processes += [
                _gunicorn(env, pages, "--worker-class", "gthread", "--workers", "2", "--threads", "8"),
                _gunicorn(
                    env, streams, "--worker-class", "gevent", "--workers", "1", "--worker-connections", "2000"
                ),
            ]
            processes += [
                subprocess.Popen([sys.executable, "worker.py"], cwd=ROOT, env=env) for _ in range(rq_workers)
            ]
            for port in (pages, streams):
                _wait(lambda port=port: _answers(f"http://127.0.0.1:{port}/login"), f"gunicorn on {port}")
            with app.app_context():
                yield Stack(app, f"http://127.0.0.1:{pages}", f"http://127.0.0.1:{streams}", llm, processes)
                db.session.remove()
                db.engine.dispose()
        finally:
            for process in reversed(processes):  # workers and web first, redis-server last
                process.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(20)
                if process.poll() is None:
                    process.kill()
            llm.close()


def _migrated_app(env: dict[str, str]) -> Flask:
    app = create_app(
        {
            "SQLALCHEMY_DATABASE_URI": _sqlalchemy_url(env["DATABASE_URL"]),
            "REDIS_URL": env["REDIS_URL"],
            "LLM_BASE_URL": env["LLM_BASE_URL"],
            "SECRET_KEY": "bench",
        }
    )
    with app.app_context():
        with db.engine.begin() as conn:
            conn.execute(sa.text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
        upgrade()
        db.engine.dispose()
    return app


def _sqlalchemy_url(url: str) -> str:
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", url)


def _gunicorn(env: dict[str, str], port: int, *options: str) -> subprocess.Popen:
    argv = [
        str(BIN / "gunicorn"),
        *options,
        # The simulated users think up to 3 s between requests; at gunicorn's default of 2 s it closes kept-alive
        # connections just as a user reuses one (a browser sends such a request again; httpx does not).
        "--keep-alive",
        "10",
        "--bind",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        "app:app",
    ]
    return subprocess.Popen(argv, cwd=ROOT, env=env)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(predicate, what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():
                return
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def seed_users(count: int, prefix: str) -> list[tuple[str, int]]:
    """`count` users, each in an account of its own with one agent and a one-to-one chat: (email, chat id)."""
    seeded = []
    for n in range(count):
        account = Account(name=f"{prefix} {n}")
        user = User(account=account, email=f"{prefix}{n}@bench.example", role="member")
        user.set_password(PASSWORD)
        agent = Agent(account=account, name="Ada", model_id="fake-model", enabled_tools=[])
        db.session.add_all([account, user, agent])
        db.session.flush()
        chat = Chat(account_id=account.id, title=f"bench {n}", manual_responses=False)
        chat.chat_agents = [ChatAgent(agent=agent)]
        db.session.add(chat)
        db.session.flush()
        seeded.append((user.email, chat.id))
    db.session.commit()
    return seeded


def signed_in_client(base_url: str, email: str) -> httpx.Client:
    """An HTTP client signed in as email, sending the CSRF token htmx would send."""
    client = httpx.Client(base_url=base_url, timeout=30)
    form = client.get("/login").text
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', form).group(1)
    response = client.post("/login", data={"email": email, "password": PASSWORD, "csrf_token": token})
    if response.status_code != 303:
        raise SystemExit(f"sign-in of {email} failed: HTTP {response.status_code}")
    page = client.get("/chats/").text
    client.headers["X-CSRFToken"] = re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)
    client.headers["HX-Request"] = "true"
    return client


def percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]
