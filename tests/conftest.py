"""Fixtures: an app per test (SQLite, or PostgreSQL with TEST_DATABASE_URL), fakeredis, a fake model server."""

import contextlib
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import fakeredis
import pytest
import sqlalchemy as sa
from flask_migrate import upgrade
from redis import Redis
from rq import Queue, Worker

from tests.fake_llm import FakeLLM
from webapp.extensions import db, limiter
from webapp.factory import create_app
from webapp.jobs.queue import redis_connection
from webapp.llm import ledger
from webapp.runtime.processes import redis_server_argv

POSTGRES_URL = os.environ.get("TEST_DATABASE_URL")


@pytest.fixture(scope="session")
def fake_llm():
    server = FakeLLM()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _fresh_fake_llm(fake_llm):
    fake_llm.reset()


@pytest.fixture(autouse=True)
def _rate_limits_counted_in_their_own_storage():
    """Flask-Limiter keeps "the storage is down" on its one module-level instance, not per app. After a test
    that ran an app without Redis, the next app would count its first requests in the fallback and the rest in
    its own storage, and a limit of one would let two through."""
    yield
    limiter._storage_dead = False


def _settings(database_url: str, llm_url: str) -> dict:
    return {
        "TESTING": True,
        "SECRET_KEY": "test",
        "SQLALCHEMY_DATABASE_URI": database_url,
        "LLM_BASE_URL": llm_url,
        "LLM_TIMEOUT_SECONDS": 5,
        "WTF_CSRF_ENABLED": False,
        "RATELIMIT_STORAGE_URI": "memory://",  # a fresh count per app
    }


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory, fake_llm):
    """A database brought to the newest schema by the real migrations, once per session."""
    if POSTGRES_URL:
        url = POSTGRES_URL
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.execute(sa.text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
        engine.dispose()
    else:
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'template.db'}"
    app = create_app(_settings(url, fake_llm.base_url))
    with app.app_context():
        upgrade()
        db.engine.dispose()
    return url


def _database_for_test(template_url: str, tmp_path) -> str:
    if POSTGRES_URL:
        return template_url
    path = tmp_path / "cairn.db"
    shutil.copy(template_url.removeprefix("sqlite:///"), path)
    return f"sqlite:///{path}"


def _on_this_machine(host) -> bool:
    if host in (None, "localhost", b"localhost"):
        return True
    try:
        return ipaddress.ip_address(host.decode() if isinstance(host, bytes) else host).is_loopback
    except ValueError:
        return False


@pytest.fixture
def offline(monkeypatch):
    """Fails the test on any attempt to reach another machine (the fake model server and PostgreSQL are on
    this one) and on any start of genai-prices' UpdatePrices, its one part that downloads. Yields the tries."""
    import genai_prices

    attempts = []

    def refuse(what, target):
        attempts.append((what, target))
        raise OSError(f"no network in this test: {what} {target!r}")

    real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host, *args, **kwargs):
        return real_getaddrinfo(host, *args, **kwargs) if _on_this_machine(host) else refuse("resolve", host)

    def connect(sock, address):
        here = not isinstance(address, tuple) or _on_this_machine(address[0])  # a unix socket is here too
        return real_connect(sock, address) if here else refuse("connect", address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(genai_prices.UpdatePrices, "start", lambda *a, **k: refuse("start", "UpdatePrices"))
    yield attempts
    assert attempts == []


@pytest.fixture
def fake_redis():
    return fakeredis.FakeRedis()


@pytest.fixture
def app(migrated_database, tmp_path, fake_llm, fake_redis):
    app = create_app(_settings(_database_for_test(migrated_database, tmp_path), fake_llm.base_url))
    app.extensions["redis"] = fake_redis
    app.extensions["rq_queue"] = Queue(app.config["RQ_QUEUE"], connection=fake_redis)
    yield from _in_context(app)


def _in_context(app):
    """Run the test inside the app's context; afterwards leave the database empty for the next test."""
    with app.app_context():
        yield app
        ledger.wait_for_rows_aside()  # the test's cost-ledger rows set aside are written before it is emptied
        db.session.remove()
        if POSTGRES_URL:
            _truncate_all()
        db.engine.dispose()


def _truncate_all() -> None:
    tables = ", ".join(t.name for t in db.metadata.sorted_tables)
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Auth:
    def __init__(self, client):
        self.client = client

    def login(self, user):
        from tests.factories import PASSWORD

        response = self.client.post("/login", data={"email": user.email, "password": PASSWORD})
        assert response.status_code == 303, response.text
        return user


@pytest.fixture
def auth(client):
    return Auth(client)


@pytest.fixture
def signed_in(auth, admin):
    """The Acme admin, signed in."""
    return auth.login(admin)


@pytest.fixture
def acme(app):
    from tests import factories

    return factories.account("Acme")


@pytest.fixture
def admin(acme):
    from tests import factories

    return factories.user(acme, "dana@example.com", "admin")


@pytest.fixture
def member(acme):
    from tests import factories

    return factories.user(acme, "milo@example.com", "member")


@pytest.fixture
def stranger(app):
    """An admin of another account, whose rows must stay invisible to Acme."""
    from tests import factories

    return factories.user(factories.account("Globex"), "eve@globex.example", "admin")


def wait_for(predicate, seconds: float = 30, what: str = "condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def redis_server(tmp_path):
    socket = tmp_path / "redis.sock"
    server = subprocess.Popen(redis_server_argv(socket, tmp_path))
    connection = Redis(unix_socket_path=str(socket))
    wait_for(lambda: socket.exists() and connection.ping(), what="redis-server")
    yield f"unix://{socket}"
    server.terminate()
    server.wait(10)


@pytest.fixture
def live_app(migrated_database, tmp_path, redis_server, fake_llm):
    """An app wired to the real redis-server, sharing its database with worker processes."""
    settings = {**_settings(_database_for_test(migrated_database, tmp_path), fake_llm.base_url)}
    settings["REDIS_URL"] = redis_server
    yield from _in_context(create_app(settings))


def worker_env(app) -> dict[str, str]:
    """The environment for a worker process that shares this app's database, redis and model server."""
    return {
        **os.environ,
        "DATABASE_URL": app.config["SQLALCHEMY_DATABASE_URI"],
        "REDIS_URL": app.config["REDIS_URL"],
        "LLM_BASE_URL": app.config["LLM_BASE_URL"],
        "SECRET_KEY": "test",
    }


@pytest.fixture
def summaries_on_their_own_model(monkeypatch):
    """Summary jobs follow replies; on the agent's own model they would take an answer scripted for a reply
    (fake_llm.reply(..., model=...)). Use before worker_process, which reads the environment."""
    monkeypatch.setenv("SUMMARY_MODEL_ID", "summary-model")


@pytest.fixture
def start_worker(live_app, summaries_on_their_own_model):
    """Starts `python worker.py [flags]` processes running `threads` jobs at once, each in a session of its own,
    and killed when the test ends. Returns once every thread of the new worker is registered with Redis."""
    root = Path(__file__).resolve().parent.parent
    started: list[subprocess.Popen] = []

    def start(*flags: str, threads: int = 1) -> subprocess.Popen:
        count = Worker.count(connection=live_app.extensions["redis"])
        worker = subprocess.Popen(
            [sys.executable, "worker.py", *flags],
            cwd=root,
            env={**worker_env(live_app), "WORKER_THREADS": str(threads)},
            start_new_session=True,
        )
        started.append(worker)
        wait_for(
            lambda: Worker.count(connection=live_app.extensions["redis"]) >= count + threads,
            60,
            "the worker to start",
        )
        return worker

    yield start
    for worker in started:  # one may be in the middle of a slow model call: no warm shutdown
        with contextlib.suppress(ProcessLookupError):  # its session: RQ's scheduler process among it
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)


@pytest.fixture
def worker_process(live_app):
    """A real RQ worker (python worker.py) running until the test ends."""
    root = Path(__file__).resolve().parent.parent
    worker = subprocess.Popen([sys.executable, "worker.py"], cwd=root, env=worker_env(live_app))
    # Ready once it has loaded what jobs need and registered with redis (seconds on a busy machine).
    wait_for(lambda: Worker.count(connection=redis_connection()) > 0, what="the worker to start")
    yield worker
    worker.terminate()
    worker.wait(20)


@pytest.fixture
def live_server(live_app):
    """The app served over HTTP on loopback from a thread, as a browser would reach it."""
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", free_port(), live_app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"  # screenshots kept by browser tests
CHROMIUM = "/usr/bin/chromium"  # Debian's; Playwright's own browser download cannot work here
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium package")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A fresh browser page; confirmation dialogs (such as "Roll back this session?") are accepted."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    expect.set_options(timeout=15_000)  # a loaded machine starts the worker slowly; assertions wait as long
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    context.close()
