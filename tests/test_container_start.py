"""What compose.yaml's containers do at start, tested without Docker: the first admin from the environment, one
schema upgrade at a time, and the relay of /mcp to the MCP container (issue 40). The whole stack on a Docker
engine is tests/test_compose.py."""

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from tests import factories
from tests.conftest import POSTGRES_URL
from webapp.extensions import db
from webapp.models import User

ROOT = Path(__file__).resolve().parent.parent
PASSWORD = "tulips in October, 4 of them"


def _admins() -> list[tuple[str, str]]:
    db.session.expire_all()
    return [(u.email, u.role) for u in db.session.scalars(sa.select(User).order_by(User.id))]


def test_the_first_admin_is_made_from_the_environment_while_no_admin_can_sign_in(app, runner, monkeypatch):
    monkeypatch.setenv("CAIRN_ADMIN_EMAIL", "Dana@Example.com")
    monkeypatch.setenv("CAIRN_ADMIN_PASSWORD", PASSWORD)

    first = runner.invoke(args=["users", "first-admin"])
    again = runner.invoke(args=["users", "first-admin"])  # every start of the stack runs it

    assert first.exit_code == 0 and "Created admin dana@example.com" in first.output
    assert again.exit_code == 0 and again.output == ""
    assert _admins() == [("dana@example.com", "admin")]
    assert db.session.scalar(sa.select(User)).check_password(PASSWORD)


def test_no_first_admin_is_made_once_an_admin_can_sign_in(app, runner, monkeypatch):
    factories.user(factories.account(), "ana@example.com", "admin")
    monkeypatch.setenv("CAIRN_ADMIN_EMAIL", "dana@example.com")
    monkeypatch.setenv("CAIRN_ADMIN_PASSWORD", PASSWORD)

    assert runner.invoke(args=["users", "first-admin"]).exit_code == 0
    assert _admins() == [("ana@example.com", "admin")]


def test_an_invited_or_removed_admin_cannot_sign_in_so_the_first_admin_is_made(app, runner, monkeypatch):
    account = factories.account()
    invited = factories.user(account, "ivy@example.com", "admin")
    invited.password_hash = "!invited"
    removed = factories.user(account, "rob@example.com", "admin")
    removed.removed_at = removed.created_at
    db.session.commit()
    monkeypatch.setenv("CAIRN_ADMIN_EMAIL", "dana@example.com")
    monkeypatch.setenv("CAIRN_ADMIN_PASSWORD", PASSWORD)

    assert runner.invoke(args=["users", "first-admin"]).exit_code == 0
    assert ("dana@example.com", "admin") in _admins()


def test_a_first_admin_email_taken_by_someone_who_cannot_sign_in_is_said_and_the_stack_starts(
    app, runner, monkeypatch
):
    invited = factories.user(factories.account(), "ivy@example.com", "admin")
    invited.password_hash = "!invited"
    factories.user(invited.account, "mo@example.com", "member")
    db.session.commit()
    monkeypatch.setenv("CAIRN_ADMIN_PASSWORD", PASSWORD)

    for email in ("IVY@example.com", "mo@example.com"):
        monkeypatch.setenv("CAIRN_ADMIN_EMAIL", email)
        result = runner.invoke(args=["users", "first-admin"])

        assert result.exit_code == 0, result.output  # migrate succeeds, so the stack starts
        assert f"CAIRN_ADMIN_EMAIL {email} is a person here already" in result.output
    assert _admins() == [("ivy@example.com", "admin"), ("mo@example.com", "member")]


def test_without_the_variables_it_says_how_to_make_the_first_admin(app, runner, monkeypatch):
    monkeypatch.delenv("CAIRN_ADMIN_EMAIL", raising=False)
    monkeypatch.delenv("CAIRN_ADMIN_PASSWORD", raising=False)

    result = runner.invoke(args=["users", "first-admin"])

    assert result.exit_code == 0
    assert "set CAIRN_ADMIN_EMAIL and CAIRN_ADMIN_PASSWORD" in result.output
    assert "flask users create EMAIL --admin" in result.output
    assert _admins() == []


def test_a_weak_first_admin_password_stops_the_start_with_the_reason(app, runner, monkeypatch):
    monkeypatch.setenv("CAIRN_ADMIN_EMAIL", "dana@example.com")
    monkeypatch.setenv("CAIRN_ADMIN_PASSWORD", "password")

    result = runner.invoke(args=["users", "first-admin"])

    assert result.exit_code == 1 and "too easy to guess" in result.output
    assert _admins() == []


@pytest.mark.skipif(not POSTGRES_URL, reason="the lock is PostgreSQL's (SQLite takes one writer at a time)")
def test_two_upgrades_at_once_of_an_empty_database_both_succeed_one_after_the_other():
    """Two containers running `flask db upgrade` together (a second migrate, or one by hand): without the
    advisory lock in migrations/env.py both would make the same tables, and one would fail."""
    server = sa.engine.make_url(POSTGRES_URL)
    admin = sa.create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql("DROP DATABASE IF EXISTS cairn_upgrade_race")
        connection.exec_driver_sql("CREATE DATABASE cairn_upgrade_race")
    url = server.set(database="cairn_upgrade_race").render_as_string(hide_password=False)
    try:
        env = {
            "DATABASE_URL": url,
            "REDIS_URL": "redis://127.0.0.1:1/0",
            "LLM_BASE_URL": "http://127.0.0.1:1/v1",
        }
        command = [sys.executable, "-m", "flask", "--app", "app", "db", "upgrade"]
        upgrades = [
            subprocess.Popen(
                command, cwd=ROOT, env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for _ in range(2)
        ]
        outputs = [upgrade.communicate(timeout=300)[0].decode() for upgrade in upgrades]

        assert [upgrade.returncode for upgrade in upgrades] == [0, 0], "\n".join(outputs)
        engine = sa.create_engine(url)
        with engine.connect() as connection:
            assert len(connection.exec_driver_sql("SELECT version_num FROM alembic_version").all()) == 1
        engine.dispose()
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql("DROP DATABASE IF EXISTS cairn_upgrade_race WITH (FORCE)")
        admin.dispose()


def _env(settings: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "LLM_BASE_URL")}
    return {**clean, "SECRET_KEY": "test", **settings}


def test_web_relays_mcp_to_the_mcp_host_it_is_given(app, client):
    """In compose.yaml the MCP process is a container of its own (MCP_HOST=mcp): the relay goes there, not to
    loopback. Here a stand-in listens on 127.0.0.2, where nothing of the app does."""

    class StandIn(BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"from": "the MCP host"}')

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.2", 0), StandIn)
    threading.Thread(target=server.handle_request, daemon=True).start()
    app.config.update(MCP_HOST="127.0.0.2", MCP_PORT=server.server_port)
    try:
        response = client.post("/mcp/ada", data=b"{}")
    finally:
        server.server_close()

    assert (response.status_code, response.json) == (200, {"from": "the MCP host"})


def _compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_restarts_every_long_running_service_and_migrates_once():
    services = _compose()["services"]

    assert set(services) == {"db", "redis", "migrate", "web", "mcp", "worker", "replies", "scheduler", "llm"}
    assert services["llm"]["profiles"] == ["local-model"]  # only with an image that has the local model
    assert services["migrate"]["restart"] == "no"
    for name, service in services.items():
        if name != "migrate":
            assert service["restart"] == "unless-stopped", name
    for name in ("web", "mcp", "worker", "replies", "scheduler"):
        assert services[name]["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}
    assert services["migrate"]["depends_on"] == {"db": {"condition": "service_healthy"}}
    assert "container_name" not in services["worker"]  # --scale worker=N
    assert services["web"]["ports"] == ["${CAIRN_BIND:-0.0.0.0}:${CAIRN_PORT:-5000}:5000"]


def test_compose_takes_its_images_from_variables_and_keeps_the_database_in_a_named_volume():
    compose = _compose()
    services = compose["services"]

    assert services["db"]["image"] == "${POSTGRES_IMAGE:-pgvector/pgvector:pg16}"
    assert services["redis"]["image"] == "${REDIS_IMAGE:-redis:7-bookworm}"
    assert services["web"]["build"]["args"]["PYTHON_IMAGE"] == "${PYTHON_IMAGE:-python:3.11-slim-bookworm}"
    assert services["db"]["volumes"] == ["db:/var/lib/postgresql/data"]
    assert {"db", "redis"} <= set(compose["volumes"])
    assert "host.docker.internal:host-gateway" in services["web"]["extra_hosts"]


def test_the_bundled_model_is_reached_at_its_own_container_when_one_is_named(tmp_path, monkeypatch):
    from webapp import config

    monkeypatch.delenv("LLM_BASE_URL", raising=False)
    monkeypatch.setenv("LOCAL_LLM_HOST", "llm")

    settings = config.load(str(tmp_path))

    assert settings["LOCAL_LLM"] and settings["LLM_BASE_URL"] == "http://llm:8088/v1"
    monkeypatch.delenv("LOCAL_LLM_HOST")
    assert config.load(str(tmp_path))["LLM_BASE_URL"] == "http://127.0.0.1:8088/v1"  # make run's
