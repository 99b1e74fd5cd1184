"""CLI: start-up checks with clear messages, users, demo data, migrations without drift."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.conftest import POSTGRES_URL, free_port
from webapp.extensions import db
from webapp.models import Agent, User

ROOT = Path(__file__).resolve().parent.parent


def flask(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "LLM_BASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "app", *args],
        env={**clean, "SECRET_KEY": "test", **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DATABASE_URL", "postgresql://cairn:secret@127.0.0.1:{port}/cairn"),
        ("REDIS_URL", "redis://127.0.0.1:{port}/0"),
        ("LLM_BASE_URL", "http://127.0.0.1:{port}/v1"),
    ],
)
def test_check_names_an_unreachable_service_without_a_traceback(tmp_path, variable, value):
    url = value.format(port=free_port())
    env = {"DATABASE_URL": f"sqlite:///{tmp_path}/x.db", variable: url}

    result = flask("check", env=env)

    assert result.returncode == 1
    assert f"FAIL  {variable} (set): cannot" in result.stderr
    assert f"Cairn cannot start: fix {variable}" in result.stderr
    assert "Traceback" not in result.stderr
    assert "secret" not in result.stderr  # passwords are never printed


def test_check_passes_with_reachable_services(tmp_path, fake_llm):
    result = flask(
        "check", env={"DATABASE_URL": f"sqlite:///{tmp_path}/x.db", "LLM_BASE_URL": fake_llm.base_url}
    )

    assert result.returncode == 0, result.stderr
    assert "ok    DATABASE_URL" in result.stdout
    assert "ok    LLM_BASE_URL" in result.stdout


def _empty_database(tmp_path) -> str:
    """A database of its own for migration tests: a new SQLite file, or an emptied PostgreSQL scratch database."""
    if not POSTGRES_URL:
        return f"sqlite:///{tmp_path}/scratch.db"
    base, test_db = POSTGRES_URL.rsplit("/", 1)
    scratch_db = f"{test_db}_scratch"  # one per test database, so checkouts sharing a server do not collide
    server = sa.create_engine(base + "/postgres", isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        if not conn.execute(
            sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": scratch_db}
        ).scalar():
            conn.execute(sa.text(f'CREATE DATABASE "{scratch_db}"'))
    server.dispose()
    url = f"{base}/{scratch_db}"
    scratch = sa.create_engine(url)
    with scratch.begin() as conn:
        conn.execute(sa.text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    scratch.dispose()
    return url


def test_migrations_build_the_models_schema_with_no_drift(tmp_path):
    env = {"DATABASE_URL": _empty_database(tmp_path)}

    assert flask("db", "upgrade", env=env).returncode == 0
    result = flask("db", "check", env=env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "No new upgrade operations detected" in result.stdout + result.stderr


def test_users_create_makes_an_admin_who_can_sign_in(app, runner):
    result = runner.invoke(
        args=["users", "create", "Ada@Example.com", "--password", "long-enough", "--admin"]
    )

    assert result.exit_code == 0, result.output
    user = db.session.scalar(sa.select(User))
    assert (user.email, user.role, user.account.name) == ("ada@example.com", "admin", "Cairn")
    assert user.check_password("long-enough") and not user.check_password("wrong")


def test_users_create_refuses_a_duplicate_or_short_password(app, runner):
    runner.invoke(args=["users", "create", "a@example.com", "--password", "long-enough"])

    assert (
        "already exists"
        in runner.invoke(args=["users", "create", "a@example.com", "--password", "x" * 9]).output
    )
    assert (
        "at least 8" in runner.invoke(args=["users", "create", "b@example.com", "--password", "short"]).output
    )


@pytest.mark.parametrize(
    ("password", "reason"),
    [
        ("12345678", "too easy to guess"),
        ("password", "too easy to guess"),
        ("ada@example.com!", "too easy to guess"),
        (" " * 8, "cannot be only spaces"),
    ],
)
def test_users_create_refuses_common_and_blank_passwords_with_a_reason(app, runner, password, reason):
    result = runner.invoke(args=["users", "create", "ada@example.com", "--password", password])

    assert result.exit_code == 1 and reason in result.output
    assert db.session.scalar(sa.select(sa.func.count()).select_from(User)) == 0


def test_users_create_puts_a_user_in_the_named_account(app, runner):
    runner.invoke(args=["users", "create", "a@example.com", "--password", "long-enough", "--account", "One"])
    runner.invoke(args=["users", "create", "b@example.com", "--password", "long-enough", "--account", "Two"])

    accounts = {u.email: u.account.name for u in db.session.scalars(sa.select(User))}
    assert accounts == {"a@example.com": "One", "b@example.com": "Two"}


def test_demo_seed_creates_an_admin_and_two_agents_once(app, runner):
    first = runner.invoke(args=["demo", "seed"])
    second = runner.invoke(args=["demo", "seed"])

    assert "admin@cairn.local / cairn-demo" in first.output
    assert "no demo data added" in second.output
    assert db.session.scalar(sa.select(sa.func.count()).select_from(User)) == 1
    agents = db.session.scalars(sa.select(Agent)).all()
    assert [a.name for a in agents] == ["Ada", "Basil"]
    assert all(a.model_id == app.config["DEFAULT_MODEL_ID"] for a in agents)


def test_upgrading_a_database_with_data_keeps_it(tmp_path):
    """Each migration runs on a database already in use, not only on an empty one."""
    url = _empty_database(tmp_path)
    env = {"DATABASE_URL": url}
    first = flask("db", "upgrade", "4c5d6a37cc4d", env=env)
    assert first.returncode == 0, first.stderr
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO accounts (id, name, created_at) VALUES (1, 'A', CURRENT_TIMESTAMP)")
        )
        conn.execute(
            sa.text(
                "INSERT INTO job_runs (id, job_type, args, status, started_at, counts) "
                "VALUES (1, 'ping', '[]', 'done', CURRENT_TIMESTAMP, '{}')"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO llm_calls (purpose, job_run_id, model, prompt_tokens, completion_tokens, latency_ms, "
                "status, created_at) VALUES ('reply', 1, 'm', 1, 1, 1, 'ok', CURRENT_TIMESTAMP)"
            )
        )

    result = flask("db", "upgrade", env=env)

    assert result.returncode == 0, result.stderr
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM llm_calls WHERE job_run_id = 1")).scalar() == 1
        assert conn.execute(sa.text("SELECT account_id FROM job_runs")).scalar() is None
    engine.dispose()


def test_a_job_run_now_without_redis_says_so_in_a_sentence(tmp_path):
    env = {
        "DATABASE_URL": f"sqlite:///{tmp_path}/x.db",
        "REDIS_URL": f"redis://:secret@127.0.0.1:{free_port()}/0",
    }
    assert flask("db", "upgrade", env=env).returncode == 0

    result = flask("jobs", "ping", "--now", env=env)

    assert result.returncode == 1
    assert "Cannot reach REDIS_URL at redis://:***@127.0.0.1:" in result.stderr
    assert "Start Redis (`make run` starts one) or set REDIS_URL" in result.stderr
    assert "Traceback" not in result.stderr and "secret" not in result.stderr
