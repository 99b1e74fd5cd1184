"""Configuration from the environment. Every default works with no configuration and no network."""

import json
import os
import secrets
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

LOCAL_LLM_PORT = 8088
LOCAL_MODEL_ID = "smollm2"
LOCAL_MODEL_CONTEXT_TOKENS = 8192  # the local model's window (n_ctx): a request and its answer together
ANSWER_RESERVE_TOKENS = 1024  # the room a request leaves for its answer when LLM_MAX_OUTPUT_TOKENS is unset
# The answers of a model that runs here are capped by default at the room its window keeps for them: a 135M
# model can ramble until its window is full (minutes on a CPU), and its server answers one request at a time.
LOCAL_MODEL_MAX_OUTPUT_TOKENS = ANSWER_RESERVE_TOKENS
OLLAMA_BASE_URL = "http://127.0.0.1:11434"


def _database_uri(instance_path: str) -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        return f"sqlite:///{Path(instance_path) / 'cairn.db'}"
    # Hosting platforms hand out postgres:// URLs; SQLAlchemy wants a driver name.
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _secret_key(instance_path: str) -> str:
    """SECRET_KEY, or one generated once and kept in instance/ so every process shares it."""
    if os.environ.get("SECRET_KEY"):
        return os.environ["SECRET_KEY"]
    path = Path(instance_path) / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()


class ConfigError(ValueError):
    """A setting Cairn cannot start with; the message names the variable and says what it must be."""


def _int(name: str, default: int) -> int:
    value = os.environ.get(name, default)
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {value!r}.") from None


def _float(name: str, default: float) -> float:
    value = os.environ.get(name, default)
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {value!r}.") from None


def _optional_int(name: str) -> int | None:
    """A whole number, or None when the variable is unset or empty."""
    return _int(name, 0) if os.environ.get(name, "").strip() else None


def _seconds_list(name: str, default: str) -> list[int]:
    value = os.environ.get(name, default)
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise ConfigError(
            f"{name} must be whole seconds separated by commas, such as {default}, not {value!r}."
        ) from None


def _prices() -> dict[str, dict[str, float]]:
    try:
        return json.loads(os.environ.get("MODEL_PRICES", "{}"))
    except json.JSONDecodeError as error:
        raise ConfigError(f"MODEL_PRICES must be JSON ({error}).") from None


def engine_options(settings: Mapping[str, Any]) -> dict:
    """SQLAlchemy's engine options for the database the app ends up with (set by create_app).

    The pool holds what a worker process may use at once: a connection on each of its threads and one more for
    each thread's search by meaning, which runs beside its search by words while the pool has one free
    (webapp.search), and one per consolidation chunk in flight on its background thread.

    Under gevent (the web process of `make run`, any stream service), SQLite waits for another writer's
    lock by sleeping inside SQLite, which holds up every greenlet of the process, the lock's holder among them
    when it is one: there, greenlets take turns on one connection (a request holds it until it ends; a
    waiting stream holds none)."""
    database_uri = settings["SQLALCHEMY_DATABASE_URI"]
    options: dict = {
        "pool_pre_ping": True,
        "pool_size": 2 * settings["WORKER_THREADS"] + settings["CONSOLIDATION_CONCURRENCY"] + 1,
    }
    if database_uri.startswith("sqlite"):
        options["module"] = sqlite_module()
    if database_uri.startswith("sqlite") and _under_gevent():
        options.update(pool_size=1, max_overflow=0)
    if database_uri.startswith("postgresql"):
        # psycopg prepares a statement run five times, and PostgreSQL then plans it once for any parameters:
        # a full-text search planned for a rare word ran 10x slower for a common one (bench.recall: 190 ms).
        options["connect_args"] = {"options": "-c plan_cache_mode=force_custom_plan"}
    return options


def one_connection(settings: dict) -> bool:
    """The process has one database connection (SQLite under gevent, see engine_options), which each request
    holds until it ends."""
    options = settings["SQLALCHEMY_ENGINE_OPTIONS"]
    return options.get("pool_size") == 1 and options.get("max_overflow") == 0


def sqlite_module() -> ModuleType:
    """The SQLite driver: the standard library's when it may load extensions (sqlite-vec), else the
    pysqlite3-binary wheel's, which may (this machine's Python is built without it)."""
    import sqlite3

    if hasattr(sqlite3.Connection, "enable_load_extension"):
        return sqlite3
    try:
        from pysqlite3 import dbapi2
    except ImportError:
        return sqlite3  # search is by words only
    return dbapi2


def _under_gevent() -> bool:
    monkey = sys.modules.get("gevent.monkey")  # imported only where gevent patched the standard library
    return monkey is not None and monkey.is_module_patched("socket")


def _fallback_secrets() -> list[str]:
    return [part.strip() for part in os.environ.get("SECRET_KEY_FALLBACKS", "").split(",") if part.strip()]


def load(instance_path: str) -> dict:
    """The app's settings: defaults overridden by environment variables."""
    Path(instance_path).mkdir(parents=True, exist_ok=True)
    scheme = os.environ.get("PREFERRED_URL_SCHEME", "http")
    return {
        "SECRET_KEY": _secret_key(instance_path),
        # Earlier SECRET_KEYs, comma-separated, while they are rotated out: sessions signed and connection keys
        # encrypted under them are still read (`flask connections rotate-key` encrypts the keys again).
        "SECRET_KEY_FALLBACKS": _fallback_secrets(),
        # Cookies are SameSite=Lax, and Secure when Cairn is served over HTTPS (PREFERRED_URL_SCHEME=https,
        # also when TLS ends at a proxy in front of it). A sign-in lasts 30 days at most, cookies or not.
        "PREFERRED_URL_SCHEME": scheme,
        "SESSION_COOKIE_SAMESITE": "Lax",
        "REMEMBER_COOKIE_SAMESITE": "Lax",
        "SESSION_COOKIE_SECURE": scheme == "https",
        "REMEMBER_COOKIE_SECURE": scheme == "https",
        "REMEMBER_COOKIE_DURATION": timedelta(days=30),
        "SQLALCHEMY_DATABASE_URI": _database_uri(instance_path),
        # No REDIS_URL: the project runs an embedded redis-server on a unix socket in instance/.
        "EMBEDDED_REDIS": not os.environ.get("REDIS_URL"),
        "REDIS_URL": os.environ.get("REDIS_URL") or f"unix://{Path(instance_path) / 'redis.sock'}",
        "RQ_QUEUE": os.environ.get("RQ_QUEUE", "cairn"),
        # The environment's connection (webapp.llm.targets): LLM_BASE_URL, or with none the SmolLM2 model the
        # project serves on loopback (at LOCAL_LLM_HOST: compose.yaml's llm container). Agents may use other
        # connections, which admins add in the app.
        "LOCAL_LLM": not os.environ.get("LLM_BASE_URL"),
        "LOCAL_LLM_PORT": _int("LOCAL_LLM_PORT", LOCAL_LLM_PORT),
        "LLM_BASE_URL": os.environ.get("LLM_BASE_URL")
        or f"http://{os.environ.get('LOCAL_LLM_HOST', '127.0.0.1')}:{_int('LOCAL_LLM_PORT', LOCAL_LLM_PORT)}/v1",
        "LLM_API_KEY": os.environ.get("LLM_API_KEY", "local"),
        "DEFAULT_MODEL_ID": os.environ.get("DEFAULT_MODEL_ID", LOCAL_MODEL_ID),
        "LLM_TIMEOUT_SECONDS": _float("LLM_TIMEOUT_SECONDS", 120),
        # The most tokens one answer may take (max_tokens); unset, the provider's own limit (a model that runs
        # here: 1024).
        "LLM_MAX_OUTPUT_TOKENS": _optional_int("LLM_MAX_OUTPUT_TOKENS"),
        # Requests one worker process sends to a connection at once (the server that runs here: one).
        "CONNECTION_CONCURRENCY": _int("CONNECTION_CONCURRENCY", 4),
        # Where the connections page looks for an Ollama to offer.
        "OLLAMA_BASE_URL": os.environ.get("OLLAMA_BASE_URL", OLLAMA_BASE_URL),
        # {"model-id": {"input": dollars per 1M tokens, "output": dollars per 1M tokens}}
        "MODEL_PRICES": _prices(),
        "JOB_MAX_RETRIES": _int("JOB_MAX_RETRIES", 3),
        # Backoff before each retry of a retryable failure (seconds, comma-separated).
        "JOB_RETRY_SECONDS": _seconds_list("JOB_RETRY_SECONDS", "10,60,300"),
        # Ask models for JSON output (response_format json_object) where a job parses JSON; off for
        # providers that reject the parameter.
        "LLM_JSON_MODE": os.environ.get("LLM_JSON_MODE", "1") not in ("0", "false", "no"),
        # Spec 000: consolidation of idle group chats into memories.
        "CONSOLIDATION_IDLE_HOURS": _float("CONSOLIDATION_IDLE_HOURS", 6),
        # What one extraction request reads; unset, a third of the model's input budget up to 100k
        # (webapp.llm.targets).
        "CONSOLIDATION_CHUNK_TOKENS": _optional_int("CONSOLIDATION_CHUNK_TOKENS"),
        "CONSOLIDATION_CONCURRENCY": _int("CONSOLIDATION_CONCURRENCY", 4),
        # The jobs a worker process runs at once, each on a thread (replies on all, background work on one).
        # How many of them talk to one connection at once is the connection's (CONNECTION_CONCURRENCY).
        "WORKER_THREADS": _int("WORKER_THREADS", 4),
        # Spec 004: once a chat has more than COMPACTION_THRESHOLD messages after its last cut, a job
        # summarizes all but the newest COMPACTION_KEEP_RECENT into the chat's memory_doc.
        "COMPACTION_THRESHOLD": _int("COMPACTION_THRESHOLD", 100),
        "COMPACTION_KEEP_RECENT": _int("COMPACTION_KEEP_RECENT", 20),
        "COMPACTION_MODEL_ID": os.environ.get("COMPACTION_MODEL_ID", ""),  # empty: the chat's first agent's
        # Per summary request; unset, a third of the model's input budget up to 50k.
        "COMPACTION_MAX_INPUT_TOKENS": _optional_int("COMPACTION_MAX_INPUT_TOKENS"),
        "MEMORY_DOC_PROMPT_TOKENS": _int(
            "MEMORY_DOC_PROMPT_TOKENS", 2_000
        ),  # newest summary sections in a prompt
        # Spec 002 with DESIGN.md 5.4: the limits of one refinement session.
        "REFINEMENT_MAX_MUTATIONS": _int("REFINEMENT_MAX_MUTATIONS", 10),
        "REFINEMENT_MAX_TURNS": _int("REFINEMENT_MAX_TURNS", 12),
        "REFINEMENT_TOKEN_FLOOR": _float("REFINEMENT_TOKEN_FLOOR", 0.5),
        # Issue 23: a staged session's proposal expires after this many days undecided (kept for the audit);
        # when refinement applied on its own removed more than this share of an agent's core memory in the last
        # 30 days, its further merges, rewrites and deletes are staged whatever its setting.
        "PROPOSAL_EXPIRY_DAYS": _int("PROPOSAL_EXPIRY_DAYS", 14),
        "DRIFT_ALARM_SHARE": _float("DRIFT_ALARM_SHARE", 0.25),
        # Replies: how many model turns a tool loop may take, and how much transcript a prompt may carry.
        "REPLY_MAX_TOOL_TURNS": _int("REPLY_MAX_TOOL_TURNS", 5),
        "TRANSCRIPT_TOKEN_BUDGET": _int("TRANSCRIPT_TOKEN_BUDGET", 6000),
        "TRANSCRIPT_MAX_MESSAGES": _int("TRANSCRIPT_MAX_MESSAGES", 200),
        # The memory section of a prompt (reply, extraction, reflection, refinement pages), unless an agent
        # sets its own; the whole input of one reply request, checked before every call of its tool loop;
        # what one recall may bring back.
        "MEMORY_TOKEN_BUDGET": _int("MEMORY_TOKEN_BUDGET", 4000),
        # PROMPT_TOKEN_BUDGET counts the model's own tokens, tool schemas included; unset, 24000, and never more
        # than the model's window less the answer's room (webapp.llm.targets).
        "PROMPT_TOKEN_BUDGET": _optional_int("PROMPT_TOKEN_BUDGET"),
        "RECALL_TOKEN_BUDGET": _int("RECALL_TOKEN_BUDGET", 2000),
        "RECALL_MAX_RESULTS": _int("RECALL_MAX_RESULTS", 10),
        # Search by meaning (webapp.search): vectors from an OpenAI-compatible /v1/embeddings endpoint, or with
        # no EMBEDDING_BASE_URL from the local all-MiniLM-L6-v2 in each process. EMBEDDING_MODEL names the
        # endpoint's model; vectors carry it, and a new one is written again by `flask memories reindex`.
        "EMBEDDING_BASE_URL": os.environ.get("EMBEDDING_BASE_URL", ""),
        "EMBEDDING_API_KEY": os.environ.get("EMBEDDING_API_KEY", ""),
        "EMBEDDING_MODEL": os.environ.get("EMBEDDING_MODEL", ""),
        "EMBEDDING_TIMEOUT_SECONDS": _float("EMBEDDING_TIMEOUT_SECONDS", 10),
        # Spec 003: the model that writes each agent's conversation summaries (empty: the agent's own model),
        # and how often the chat page's cross-conversation panel refreshes.
        "SUMMARY_MODEL_ID": os.environ.get("SUMMARY_MODEL_ID", ""),
        "CROSS_CONVERSATION_REFRESH_SECONDS": _int("CROSS_CONVERSATION_REFRESH_SECONDS", 20),
        "MESSAGE_MAX_CHARS": 20_000,
        # The largest request body (bytes) the app reads: forms, /v1 and /mcp. Larger ones are refused with 413
        # before they are read; an agent file upload (the one route that takes a file) may be up to
        # AGENT_FILE_MAX_BYTES.
        "REQUEST_MAX_BYTES": _int("REQUEST_MAX_BYTES", 4 * 2**20),
        "AGENT_FILE_MAX_BYTES": _int("AGENT_FILE_MAX_BYTES", 64 * 2**20),
        "MESSAGES_PER_PAGE": 50,
        # Live reply streams one user may hold open at once (tabs of chat pages); more are refused with 429.
        "STREAM_MAX_PER_USER": _int("STREAM_MAX_PER_USER", 8),
        # Seconds of silence before a stream sends a comment; a browser that left is noticed by then or so.
        "STREAM_KEEPALIVE_SECONDS": _float("STREAM_KEEPALIVE_SECONDS", 10),
        # Flask-Limiter limits (its notation). Messages and agent triggers share one per-user budget; sign-in
        # attempts that fail count per email and per client address. Storage: the app's Redis.
        "RATE_LIMIT_REPLIES": os.environ.get("RATE_LIMIT_REPLIES", "20 per minute; 300 per hour"),
        "RATE_LIMIT_LOGIN_PER_ACCOUNT": os.environ.get("RATE_LIMIT_LOGIN_PER_ACCOUNT", "10 per 15 minutes"),
        "RATE_LIMIT_LOGIN_PER_ADDRESS": os.environ.get("RATE_LIMIT_LOGIN_PER_ADDRESS", "30 per 15 minutes"),
        # Proxies in front of gunicorn that set X-Forwarded-For/-Proto/-Host (0: the connection is the client).
        "TRUSTED_PROXY_HOPS": _int("TRUSTED_PROXY_HOPS", 0),
        # The MCP server's HTTP process (webapp.mcp.http) listens at this port, on 127.0.0.1 under `make run`;
        # the web process relays /mcp to it at MCP_HOST (in compose.yaml, its own container: mcp). Its
        # requests are limited per API key, counted in the same storage.
        "MCP_HOST": os.environ.get("MCP_HOST", "127.0.0.1"),
        "MCP_PORT": _int("MCP_PORT", 8002),
        "RATE_LIMIT_MCP": os.environ.get("RATE_LIMIT_MCP", "120 per minute; 3000 per hour"),
        # Browser origins besides Cairn's own that may call the MCP server (comma-separated, as
        # `https://app.example`); a request from any other Origin is refused (403), one with none is not.
        "MCP_ALLOWED_ORIGINS": [
            part.strip().rstrip("/").lower()
            for part in os.environ.get("MCP_ALLOWED_ORIGINS", "").split(",")
            if part.strip()
        ],
        # Where `flask models pull` and the admin page download the local models' catalog files from (the
        # catalog pins their paths and hashes: webapp/local_models/catalog.py); a mirror, or a stand-in in tests.
        "MODEL_DOWNLOAD_BASE_URL": os.environ.get("MODEL_DOWNLOAD_BASE_URL", "https://huggingface.co"),
        **_oidc(),
    }


def _oidc() -> dict:
    """Sign-in with the team's identity provider (webapp.web.oidc checks these; README): off with no issuer."""
    env = {name: os.environ.get(f"OIDC_{name}", "").strip() for name in _OIDC_NAMES}
    return {
        **{f"OIDC_{name}": env[name] for name in _OIDC_NAMES},
        "OIDC_ISSUER": env["ISSUER"].rstrip("/"),
        "OIDC_SCOPES": env["SCOPES"] or "openid email profile",
        "OIDC_NAME": env["NAME"] or "SSO",  # the button says "Sign in with SSO"
        "OIDC_ONLY": env["ONLY"].lower() in ("1", "true", "yes"),
        "OIDC_ALLOWED_DOMAINS": [
            d.strip().lstrip("@").lower() for d in env["ALLOWED_DOMAINS"].split(",") if d.strip()
        ],
        "OIDC_GROUPS_CLAIM": env["GROUPS_CLAIM"] or "groups",
    }


_OIDC_NAMES = ("ISSUER", "CLIENT_ID", "CLIENT_SECRET", "SCOPES", "NAME", "ONLY", "ALLOWED_DOMAINS", "ACCOUNT")
_OIDC_NAMES += ("ACCOUNT_CLAIM", "ADMIN_GROUP", "GROUPS_CLAIM")


# The range of every numeric setting (None: unbounded on that side), checked at start-up by validate().
BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "LOCAL_LLM_PORT": (1, 65_535),
    "MCP_PORT": (1, 65_535),
    "LLM_TIMEOUT_SECONDS": (0.1, None),
    "EMBEDDING_TIMEOUT_SECONDS": (0.1, None),
    "JOB_MAX_RETRIES": (0, None),
    "CONSOLIDATION_IDLE_HOURS": (0, None),
    "CONSOLIDATION_CONCURRENCY": (1, None),
    "WORKER_THREADS": (1, 64),
    "CONNECTION_CONCURRENCY": (1, 64),
    "COMPACTION_THRESHOLD": (1, None),
    "COMPACTION_KEEP_RECENT": (0, None),
    "MEMORY_DOC_PROMPT_TOKENS": (1, None),
    "REFINEMENT_MAX_MUTATIONS": (1, None),
    "REFINEMENT_MAX_TURNS": (1, None),
    "REFINEMENT_TOKEN_FLOOR": (0, 1),
    "PROPOSAL_EXPIRY_DAYS": (1, None),
    "DRIFT_ALARM_SHARE": (0.01, 1),
    "REPLY_MAX_TOOL_TURNS": (1, None),
    "TRANSCRIPT_TOKEN_BUDGET": (1, None),
    "TRANSCRIPT_MAX_MESSAGES": (1, None),
    "CROSS_CONVERSATION_REFRESH_SECONDS": (1, None),
    "MEMORY_TOKEN_BUDGET": (1, None),
    "RECALL_TOKEN_BUDGET": (1, None),
    "RECALL_MAX_RESULTS": (1, None),
    "STREAM_MAX_PER_USER": (1, None),
    "STREAM_KEEPALIVE_SECONDS": (0.1, None),
    "TRUSTED_PROXY_HOPS": (0, None),
    "MESSAGE_MAX_CHARS": (1, None),
    "REQUEST_MAX_BYTES": (64 * 1024, None),
    "AGENT_FILE_MAX_BYTES": (64 * 1024, None),
    "MESSAGES_PER_PAGE": (1, None),
}
OPTIONAL_BOUNDS: dict[str, tuple[float | None, float | None]] = {  # checked when set
    "LLM_MAX_OUTPUT_TOKENS": (1, None),
    "PROMPT_TOKEN_BUDGET": (1, None),
    "CONSOLIDATION_CHUNK_TOKENS": (1, None),
    "COMPACTION_MAX_INPUT_TOKENS": (1, None),
}


def validate(settings: Mapping[str, Any]) -> None:
    """Refuse to start with a numeric setting out of its range, naming the variable (raises ConfigError)."""
    optional = {name: bounds for name, bounds in OPTIONAL_BOUNDS.items() if settings.get(name) is not None}
    for name, (low, high) in {**BOUNDS, **optional}.items():
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name} must be a number, not {value!r}.")
        if (low is not None and value < low) or (high is not None and value > high):
            raise ConfigError(f"{name} is {value}; it must be {_range(low, high)}.")
    _validate_retry_waits(settings["JOB_RETRY_SECONDS"])
    if settings["COMPACTION_KEEP_RECENT"] >= settings["COMPACTION_THRESHOLD"]:
        raise ConfigError(
            f"COMPACTION_KEEP_RECENT ({settings['COMPACTION_KEEP_RECENT']}) must be less than "
            f"COMPACTION_THRESHOLD ({settings['COMPACTION_THRESHOLD']}): compaction summarizes the messages "
            "beyond the most recent ones once a chat has more than the threshold."
        )
    _validate_prices(settings["MODEL_PRICES"])
    if settings["PREFERRED_URL_SCHEME"] not in ("http", "https"):
        raise ConfigError(
            f"PREFERRED_URL_SCHEME must be http or https, not {settings['PREFERRED_URL_SCHEME']!r}."
        )


def _validate_retry_waits(waits: Any) -> None:
    if not isinstance(waits, list) or not waits or not all(isinstance(w, int) for w in waits):
        raise ConfigError("JOB_RETRY_SECONDS must be whole seconds separated by commas, such as 10,60,300.")
    if negative := [w for w in waits if w < 0]:
        raise ConfigError(
            f"JOB_RETRY_SECONDS has {negative[0]}; a wait before a retry must be at least 0 seconds."
        )


def _range(low: float | None, high: float | None) -> str:
    if high is None:
        return f"at least {low}"
    return f"between {low} and {high}"


def _validate_prices(prices: Any) -> None:
    example = '{"model-id": {"input": 0.15, "output": 0.6}}'
    if not isinstance(prices, dict):
        raise ConfigError(f"MODEL_PRICES must be a JSON object such as {example}.")
    for model, price in prices.items():
        if not isinstance(price, dict):
            raise ConfigError(f"MODEL_PRICES[{model!r}] must be an object such as {example}.")
        for side, dollars in price.items():
            if side not in ("input", "output"):
                raise ConfigError(f"MODEL_PRICES[{model!r}] has {side!r}; only input and output are priced.")
            if isinstance(dollars, bool) or not isinstance(dollars, int | float) or dollars < 0:
                raise ConfigError(
                    f"MODEL_PRICES[{model!r}][{side!r}] must be dollars per million tokens (a number >= 0), "
                    f"not {dollars!r}."
                )
