"""Configuration from the environment. Every default works with no configuration and no network."""

import json
import os
import secrets
from pathlib import Path

LOCAL_LLM_PORT = 8088
LOCAL_MODEL_ID = "smollm2"


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


def _int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def load(instance_path: str) -> dict:
    """The app's settings: defaults overridden by environment variables."""
    Path(instance_path).mkdir(parents=True, exist_ok=True)
    return {
        "SECRET_KEY": _secret_key(instance_path),
        "SQLALCHEMY_DATABASE_URI": _database_uri(instance_path),
        "SQLALCHEMY_ENGINE_OPTIONS": {"pool_pre_ping": True},
        # No REDIS_URL: the project runs an embedded redis-server on a unix socket in instance/.
        "EMBEDDED_REDIS": not os.environ.get("REDIS_URL"),
        "REDIS_URL": os.environ.get("REDIS_URL") or f"unix://{Path(instance_path) / 'redis.sock'}",
        "RQ_QUEUE": os.environ.get("RQ_QUEUE", "cairn"),
        # No LLM_BASE_URL: the project serves the local SmolLM2 model on loopback.
        "LOCAL_LLM": not os.environ.get("LLM_BASE_URL"),
        "LOCAL_LLM_PORT": _int("LOCAL_LLM_PORT", LOCAL_LLM_PORT),
        "LLM_BASE_URL": os.environ.get("LLM_BASE_URL")
        or f"http://127.0.0.1:{_int('LOCAL_LLM_PORT', LOCAL_LLM_PORT)}/v1",
        "LLM_API_KEY": os.environ.get("LLM_API_KEY", "local"),
        "DEFAULT_MODEL_ID": os.environ.get("DEFAULT_MODEL_ID", LOCAL_MODEL_ID),
        "LLM_TIMEOUT_SECONDS": float(os.environ.get("LLM_TIMEOUT_SECONDS", 120)),
        # {"model-id": {"input": dollars per 1M tokens, "output": dollars per 1M tokens}}
        "MODEL_PRICES": json.loads(os.environ.get("MODEL_PRICES", "{}")),
        "JOB_MAX_RETRIES": _int("JOB_MAX_RETRIES", 3),
        # Ask models for JSON output (response_format json_object) where a job parses JSON; off for
        # providers that reject the parameter.
        "LLM_JSON_MODE": os.environ.get("LLM_JSON_MODE", "1") not in ("0", "false", "no"),
        # Spec 000: consolidation of idle group chats into memories.
        "CONSOLIDATION_IDLE_HOURS": float(os.environ.get("CONSOLIDATION_IDLE_HOURS", 6)),
        "CONSOLIDATION_CHUNK_TOKENS": _int("CONSOLIDATION_CHUNK_TOKENS", 100_000),
        "CONSOLIDATION_CONCURRENCY": _int("CONSOLIDATION_CONCURRENCY", 4),
        # Spec 004: once a chat has more than COMPACTION_THRESHOLD messages after its last cut, a job
        # summarizes all but the newest COMPACTION_KEEP_RECENT into the chat's memory_doc.
        "COMPACTION_THRESHOLD": _int("COMPACTION_THRESHOLD", 100),
        "COMPACTION_KEEP_RECENT": _int("COMPACTION_KEEP_RECENT", 20),
        "COMPACTION_MODEL_ID": os.environ.get("COMPACTION_MODEL_ID", ""),  # empty: the chat's first agent's
        "COMPACTION_MAX_INPUT_TOKENS": _int("COMPACTION_MAX_INPUT_TOKENS", 50_000),  # per summary request
        "MEMORY_DOC_PROMPT_TOKENS": _int(
            "MEMORY_DOC_PROMPT_TOKENS", 2_000
        ),  # newest summary sections in a prompt
        # Spec 002 with DESIGN.md 5.4: the limits of one refinement session.
        "REFINEMENT_MAX_MUTATIONS": _int("REFINEMENT_MAX_MUTATIONS", 10),
        "REFINEMENT_MAX_TURNS": _int("REFINEMENT_MAX_TURNS", 12),
        "REFINEMENT_TOKEN_FLOOR": float(os.environ.get("REFINEMENT_TOKEN_FLOOR", 0.5)),
        # Replies: how many model turns a tool loop may take, and how much transcript a prompt may carry.
        "REPLY_MAX_TOOL_TURNS": _int("REPLY_MAX_TOOL_TURNS", 5),
        "TRANSCRIPT_TOKEN_BUDGET": _int("TRANSCRIPT_TOKEN_BUDGET", 6000),
        "TRANSCRIPT_MAX_MESSAGES": _int("TRANSCRIPT_MAX_MESSAGES", 200),
        # The memory section of a prompt (reply, extraction, reflection, refinement pages), unless an agent
        # sets its own; the whole input of one reply request, checked before every call of its tool loop;
        # what one recall may bring back.
        "MEMORY_TOKEN_BUDGET": _int("MEMORY_TOKEN_BUDGET", 4000),
        "PROMPT_TOKEN_BUDGET": _int("PROMPT_TOKEN_BUDGET", 24_000),
        "RECALL_TOKEN_BUDGET": _int("RECALL_TOKEN_BUDGET", 1200),
        "RECALL_MAX_RESULTS": _int("RECALL_MAX_RESULTS", 8),
        # Spec 003: the model that writes each agent's conversation summaries (empty: the agent's own model),
        # and how often the chat page's cross-conversation panel refreshes.
        "SUMMARY_MODEL_ID": os.environ.get("SUMMARY_MODEL_ID", ""),
        "CROSS_CONVERSATION_REFRESH_SECONDS": _int("CROSS_CONVERSATION_REFRESH_SECONDS", 20),
        "MESSAGE_MAX_CHARS": 20_000,
        "MESSAGES_PER_PAGE": 50,
        # Live reply streams one user may hold open at once (tabs of chat pages); more are refused with 429.
        "STREAM_MAX_PER_USER": _int("STREAM_MAX_PER_USER", 8),
        # Seconds of silence before a stream sends a comment; a browser that left is noticed by then or so.
        "STREAM_KEEPALIVE_SECONDS": float(os.environ.get("STREAM_KEEPALIVE_SECONDS", 10)),
        # Flask-Limiter limits (its notation). Messages and agent triggers share one per-user budget; sign-in
        # attempts that fail count per email and per client address. Storage: the app's Redis.
        "RATE_LIMIT_REPLIES": os.environ.get("RATE_LIMIT_REPLIES", "20 per minute; 300 per hour"),
        "RATE_LIMIT_LOGIN_PER_ACCOUNT": os.environ.get("RATE_LIMIT_LOGIN_PER_ACCOUNT", "10 per 15 minutes"),
        "RATE_LIMIT_LOGIN_PER_ADDRESS": os.environ.get("RATE_LIMIT_LOGIN_PER_ADDRESS", "30 per 15 minutes"),
        # Proxies in front of gunicorn that set X-Forwarded-For/-Proto/-Host (0: the connection is the client).
        "TRUSTED_PROXY_HOPS": _int("TRUSTED_PROXY_HOPS", 0),
    }
