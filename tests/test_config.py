"""With no configuration Cairn uses SQLite, the embedded redis and the local model; variables switch each."""

from pathlib import Path

import pytest

from tests.test_cli import flask
from webapp import config
from webapp.factory import create_app
from webapp.runtime.processes import procfile_names

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
    assert procfile_names(settings) == [
        "web",
        "mcp",
        "worker",
        "replies",
        "scheduler",
        "redis",
        "llm",
        "ready",
    ]


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
    assert procfile_names(settings) == ["web", "mcp", "worker", "replies", "scheduler", "ready"]


# Validation at start-up (issue 12, item 14)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"COMPACTION_KEEP_RECENT": "100"},
            "COMPACTION_KEEP_RECENT (100) must be less than COMPACTION_THRESHOLD (100)",
        ),
        (
            {"COMPACTION_THRESHOLD": "10", "COMPACTION_KEEP_RECENT": "20"},
            "COMPACTION_KEEP_RECENT (20) must be less",
        ),
        ({"COMPACTION_THRESHOLD": "ten"}, "COMPACTION_THRESHOLD must be a whole number, not 'ten'"),
        ({"CONSOLIDATION_IDLE_HOURS": "six"}, "CONSOLIDATION_IDLE_HOURS must be a number, not 'six'"),
        ({"CONSOLIDATION_CONCURRENCY": "0"}, "CONSOLIDATION_CONCURRENCY is 0; it must be at least 1"),
        ({"REFINEMENT_TOKEN_FLOOR": "1.5"}, "REFINEMENT_TOKEN_FLOOR is 1.5; it must be between 0 and 1"),
        ({"JOB_MAX_RETRIES": "-1"}, "JOB_MAX_RETRIES is -1; it must be at least 0"),
        ({"LOCAL_LLM_PORT": "70000"}, "LOCAL_LLM_PORT is 70000; it must be between 1 and 65535"),
        ({"TRANSCRIPT_TOKEN_BUDGET": "-5"}, "TRANSCRIPT_TOKEN_BUDGET is -5; it must be at least 1"),
        ({"MODEL_PRICES": "{not json"}, "MODEL_PRICES must be JSON"),
        (
            {"MODEL_PRICES": '{"m": {"input": "cheap"}}'},
            "MODEL_PRICES['m']['input'] must be dollars per million",
        ),
        ({"MODEL_PRICES": '{"m": {"input": -1}}'}, "MODEL_PRICES['m']['input'] must be dollars per million"),
        ({"PREFERRED_URL_SCHEME": "ftp"}, "PREFERRED_URL_SCHEME must be http or https"),
        (
            {"JOB_RETRY_SECONDS": "10,sixty"},
            "JOB_RETRY_SECONDS must be whole seconds separated by commas, such as 10,60,300, not '10,sixty'",
        ),
        (
            {"JOB_RETRY_SECONDS": "10,-60"},
            "JOB_RETRY_SECONDS has -60; a wait before a retry must be at least 0",
        ),
        ({"JOB_RETRY_SECONDS": ""}, "JOB_RETRY_SECONDS must be whole seconds separated by commas"),
        ({"LLM_MAX_OUTPUT_TOKENS": "lots"}, "LLM_MAX_OUTPUT_TOKENS must be a whole number, not 'lots'"),
        ({"LLM_MAX_OUTPUT_TOKENS": "0"}, "LLM_MAX_OUTPUT_TOKENS is 0; it must be at least 1"),
        ({"WORKER_THREADS": "0"}, "WORKER_THREADS is 0; it must be between 1 and 64"),
    ],
)
def test_a_bad_setting_stops_start_up_naming_the_variable(bare_env, tmp_path, monkeypatch, env, message):
    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(config.ConfigError) as raised:
        create_app()

    assert message in str(raised.value)


def test_every_numeric_setting_has_a_range(bare_env, tmp_path):
    settings = config.load(str(tmp_path))

    numeric = {k for k, v in settings.items() if isinstance(v, int | float) and not isinstance(v, bool)}

    assert set(config.BOUNDS) <= numeric <= set(config.BOUNDS) | set(config.OPTIONAL_BOUNDS)
    config.validate(settings)  # the defaults are valid


def test_retry_waits_and_the_output_cap_come_from_the_environment(bare_env, tmp_path, monkeypatch):
    from webapp.llm import targets

    for name in ("JOB_RETRY_SECONDS", "LLM_MAX_OUTPUT_TOKENS", "PROMPT_TOKEN_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))
    defaults = create_app({"SECRET_KEY": "x"})
    monkeypatch.setenv("JOB_RETRY_SECONDS", " 5, 30 ,0")
    monkeypatch.setenv("LLM_MAX_OUTPUT_TOKENS", "2000")
    settings = create_app({"SECRET_KEY": "x"})

    assert defaults.config["JOB_RETRY_SECONDS"] == [10, 60, 300]
    with defaults.app_context():  # the local model rambles: capped by default; a provider: its own limit
        assert targets.for_environment("smollm2").max_output_tokens() == config.LOCAL_MODEL_MAX_OUTPUT_TOKENS
        defaults.config["LOCAL_LLM"] = False
        assert targets.for_environment("gpt-4o").max_output_tokens() is None
    assert (settings.config["JOB_RETRY_SECONDS"], settings.config["LLM_MAX_OUTPUT_TOKENS"]) == (
        [5, 30, 0],
        2000,
    )
    with settings.app_context():  # the local model's window keeps room for that answer
        assert targets.for_environment("smollm2").input_budget() == config.LOCAL_MODEL_CONTEXT_TOKENS - 2000


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"JOB_RETRY_SECONDS": [10, -1]}, "JOB_RETRY_SECONDS has -1"),
        ({"JOB_RETRY_SECONDS": []}, "JOB_RETRY_SECONDS must be whole seconds"),
        ({"LLM_MAX_OUTPUT_TOKENS": -3}, "LLM_MAX_OUTPUT_TOKENS is -3; it must be at least 1"),
    ],
)
def test_retry_waits_and_the_output_cap_given_by_a_test_config_are_validated(
    tmp_path, monkeypatch, given, message
):
    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))

    with pytest.raises(config.ConfigError, match=message):
        create_app({"SECRET_KEY": "x", **given})


def test_a_test_config_is_validated_too(tmp_path, monkeypatch):
    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))

    with pytest.raises(config.ConfigError, match="MESSAGES_PER_PAGE is 0"):
        create_app({"SECRET_KEY": "x", "MESSAGES_PER_PAGE": 0})


def test_the_cli_names_the_bad_setting_without_a_traceback(tmp_path):
    env = {"DATABASE_URL": f"sqlite:///{tmp_path}/x.db", "COMPACTION_KEEP_RECENT": "150"}

    result = flask("check", env=env)

    assert result.returncode == 1
    assert (
        "Cairn cannot start: COMPACTION_KEEP_RECENT (150) must be less than COMPACTION_THRESHOLD"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


def test_postgresql_plans_each_statement_for_its_own_parameters():
    """psycopg prepares a statement run five times and PostgreSQL then plans it once for any parameters: a
    full-text search planned for a rare word ran ten times slower for a common one (bench.recall)."""
    app = create_app(
        {"SQLALCHEMY_DATABASE_URI": "postgresql+psycopg://cairn@127.0.0.1/cairn", "SECRET_KEY": "x"}
    )

    options = app.config["SQLALCHEMY_ENGINE_OPTIONS"]["connect_args"]["options"]
    assert options == "-c plan_cache_mode=force_custom_plan"
    assert "connect_args" not in create_app({"SECRET_KEY": "x"}).config["SQLALCHEMY_ENGINE_OPTIONS"]  # SQLite


def test_what_a_memory_job_reads_at_once_fits_the_local_models_window(bare_env, tmp_path, monkeypatch):
    """A 100k-token consolidation chunk or a 50k-token compaction request would overflow the local model's
    8k window (its context error, retried for ever); a provider that gives no window reads that much at once,
    one that gives its window a third of it."""
    from webapp.llm import targets

    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))
    app = create_app({"SECRET_KEY": "x"})
    with app.app_context():
        local = targets.for_environment("smollm2")
        budget = local.input_budget()
        for setting, cap in (
            ("CONSOLIDATION_CHUNK_TOKENS", 100_000),
            ("COMPACTION_MAX_INPUT_TOKENS", 50_000),
        ):
            worst_case = (
                local.chunk_tokens(setting, cap) * 1.5 + budget / 3
            )  # SmolLM2 tokens, with the memory list
            assert worst_case < budget, setting
            app.config["LOCAL_LLM"] = False
            assert targets.for_environment("gpt-4o").chunk_tokens(setting, cap) == cap
            app.config["LOCAL_LLM"] = True


def test_a_worker_runs_several_jobs_at_once_and_the_local_model_answers_one(bare_env, tmp_path, monkeypatch):
    """The local model answers one request at a time: a worker's threads take turns there (one request at a
    time per process) while they ask a provider at once. A worker's database pool holds what all its threads
    may use."""
    from webapp.llm import targets

    monkeypatch.setenv("INSTANCE_PATH", str(tmp_path))
    local = create_app({"SECRET_KEY": "x"})
    monkeypatch.setenv("LLM_BASE_URL", "https://api.example.com/v1")
    provider = create_app({"SECRET_KEY": "x"})

    assert (local.config["WORKER_THREADS"], provider.config["WORKER_THREADS"]) == (4, 4)
    with local.app_context():
        assert targets.for_environment("smollm2").concurrency() == 1
    with provider.app_context():
        assert targets.for_environment("gpt-4o").concurrency() == 4
    pool = provider.config["SQLALCHEMY_ENGINE_OPTIONS"]["pool_size"]
    assert pool >= 2 * provider.config["WORKER_THREADS"] + provider.config["CONSOLIDATION_CONCURRENCY"]
