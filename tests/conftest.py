"""Fixtures: an app per test (SQLite, or PostgreSQL with TEST_DATABASE_URL), fakeredis, a fake model server."""

import os
import shutil
import socket

import fakeredis
import pytest
import sqlalchemy as sa
from flask_migrate import upgrade
from rq import Queue

from tests.fake_llm import FakeLLM
from webapp import create_app
from webapp.extensions import db

POSTGRES_URL = os.environ.get("TEST_DATABASE_URL")


@pytest.fixture(scope="session")
def fake_llm():
    server = FakeLLM()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def _fresh_fake_llm(fake_llm):
    fake_llm.reset()


def _settings(database_url: str, llm_url: str) -> dict:
    return {
        "TESTING": True,
        "SECRET_KEY": "test",
        "SQLALCHEMY_DATABASE_URI": database_url,
        "LLM_BASE_URL": llm_url,
        "LLM_TIMEOUT_SECONDS": 5,
        "WTF_CSRF_ENABLED": False,
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


@pytest.fixture
def fake_redis():
    return fakeredis.FakeRedis()


@pytest.fixture
def app(migrated_database, tmp_path, fake_llm, fake_redis):
    app = create_app(_settings(_database_for_test(migrated_database, tmp_path), fake_llm.base_url))
    app.extensions["redis"] = fake_redis
    app.extensions["rq_queue"] = Queue(app.config["RQ_QUEUE"], connection=fake_redis)
    with app.app_context():
        yield app
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
