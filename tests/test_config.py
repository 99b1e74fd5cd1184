"""With no configuration Cairn uses SQLite, the embedded redis and the local model; variables switch each."""

from pathlib import Path

import pytest

from webapp import config
from webapp.processes import procfile_names

VARIABLES = ("DATABASE_URL", "REDIS_URL", "LLM_BASE_URL", "LLM_API_KEY", "SECRET_KEY", "MODEL_PRICES")


@pytest.fixture
def bare_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_defaults_need_no_configuration(bare_env, tmp_path):
    settings = config.load(str(tmp_path))

    assert settings["SQLALCHEMY_DATABASE_URI"] == f"sqlite:///{tmp_path / 'cairn.db'}"
    assert settings["EMBEDDED_REDIS"] and settings["REDIS_URL"] == f"unix://{tmp_path / 'redis.sock'}"
    assert settings["LOCAL_LLM"] and settings["LLM_BASE_URL"] == "http://127.0.0.1:8088/v1"
    assert procfile_names(settings) == ["web", "worker", "scheduler", "redis", "llm"]


def test_the_generated_secret_key_is_kept_for_every_process(bare_env, tmp_path):
    first = config.load(str(tmp_path))["SECRET_KEY"]

    assert len(first) == 64
    assert config.load(str(tmp_path))["SECRET_KEY"] == first
    assert (Path(tmp_path) / "secret_key").stat().st_mode & 0o077 == 0


def test_variables_switch_to_external_services(bare_env, tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db.internal:5432/cairn")
    monkeypatch.setenv("REDIS_URL", "redis://cache.internal:6379/0")
    monkeypatch.setenv("LLM_BASE_URL", "https://llm.example.test/api/v1")
    monkeypatch.setenv("MODEL_PRICES", '{"m": {"input": 1.5, "output": 6}}')

    settings = config.load(str(tmp_path))

    assert settings["SQLALCHEMY_DATABASE_URI"] == "postgresql+psycopg://u:p@db.internal:5432/cairn"
    assert not settings["EMBEDDED_REDIS"] and settings["REDIS_URL"] == "redis://cache.internal:6379/0"
    assert not settings["LOCAL_LLM"] and settings["LLM_BASE_URL"] == "https://llm.example.test/api/v1"
    assert settings["MODEL_PRICES"] == {"m": {"input": 1.5, "output": 6}}
    assert procfile_names(settings) == ["web", "worker", "scheduler"]
