"""Connections: the model providers an account's admins add (an OpenAI-compatible API, an Ollama), each with the
models it lists. An agent names a connection and a model (webapp.llm.targets turns them into a request's target).

The environment's provider (LLM_BASE_URL, or with none the model Cairn runs itself) is a connection too, but not
a row: it is read from the settings each time (environment_connection), so its key never enters the database.
An agent with no connection uses it, which is how every agent made before connections keeps answering as before.

Secrets are write-only: an API key and extra headers are stored encrypted with Fernet under a key derived from
SECRET_KEY (and readable under SECRET_KEY_FALLBACKS while keys are rotated: `flask connections rotate-key`), and
no page, export, log or error shows them again; a page shows only `masked_key`.
"""

import base64
import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flask import current_app
from sqlalchemy.orm import Mapped, mapped_column

from webapp.extensions import JSON, db
from webapp.models.accounts import Account
from webapp.models.agents import Agent
from webapp.timeutil import utcnow

# What a connection is: an OpenAI-compatible API (OpenRouter, OpenAI, vLLM, LM Studio...), an Ollama server (its
# own API lists models and their windows; it answers on /v1), or the model server Cairn runs itself.
KINDS = ("openai", "ollama", "local")
KIND_NAMES = {"openai": "OpenAI-compatible", "ollama": "Ollama", "local": "Runs here (llama.cpp)"}
MAX_NAME_CHARS = 60
ENVIRONMENT = "environment"  # the id of the environment's connection in forms and pickers


class SecretError(ValueError):
    """A stored secret cannot be read with SECRET_KEY or any of SECRET_KEY_FALLBACKS."""


class ModelListing:
    """What a connection says of its models: those the provider listed (`models`) and what an admin set for one
    (`model_settings`)."""

    @property
    def model_ids(self) -> list[str]:
        return [m["id"] for m in self.models or []]

    def listed_context_tokens(self, model: str) -> int | None:
        """The window the provider gave for this model, if it said."""
        return next((m.get("context_tokens") for m in self.models or [] if m["id"] == model), None)

    def setting(self, model: str, name: str) -> Any:
        return (self.model_settings or {}).get(model, {}).get(name)


class Connection(db.Model, ModelListing):
    """A model provider an account's admins added."""

    __tablename__ = "connections"
    __table_args__ = (sa.UniqueConstraint("account_id", "name", name="uq_connections_account_id_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(sa.String(MAX_NAME_CHARS))
    kind: Mapped[str] = mapped_column(
        sa.Enum(*KINDS, name="connection_kind", native_enum=False, create_constraint=True)
    )
    base_url: Mapped[str] = mapped_column(sa.String(500))
    # Fernet tokens (text); None: no key (a local Ollama needs none).
    api_key_secret: Mapped[str | None] = mapped_column(sa.Text)
    headers_secret: Mapped[str | None] = mapped_column(sa.Text)
    # The last 4 characters of the key, to tell keys apart on the page ("…a1b2").
    key_hint: Mapped[str | None] = mapped_column(sa.String(8))
    # What the provider listed at the last refresh: [{"id": ..., "context_tokens": int or None}].
    models: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    models_fetched_at: Mapped[datetime | None]
    # What an admin set per model: {"model-id": {"context_tokens": N, "input": $/1M, "output": $/1M}}.
    model_settings: Mapped[dict[str, dict[str, Any]]] = mapped_column(JSON, default=dict)
    # The last test or model request: when it was checked, and what failed (None: it worked).
    checked_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    @property
    def key(self) -> str:
        """The connection's ref in forms and pickers."""
        return str(self.id)

    @property
    def api_key(self) -> str:
        return decrypt(self.api_key_secret) if self.api_key_secret else ""

    @api_key.setter
    def api_key(self, value: str) -> None:
        value = value.strip()
        self.api_key_secret = encrypt(value) if value else None
        self.key_hint = value[-4:] if len(value) >= 12 else None

    @property
    def headers(self) -> dict[str, str]:
        return json.loads(decrypt(self.headers_secret)) if self.headers_secret else {}

    @headers.setter
    def headers(self, value: dict[str, str]) -> None:
        self.headers_secret = encrypt(json.dumps(value)) if value else None

    @property
    def headers_count(self) -> int:
        return len(self.headers)

    @property
    def masked_key(self) -> str:
        """What a page shows of the key: that there is one, and its last characters when it is long."""
        if not self.api_key_secret:
            return "none"
        return f"•••• {self.key_hint}" if self.key_hint else "••••"


@dataclass
class EnvironmentConnection(ModelListing):
    """The provider the environment configures, read from the settings each time: LLM_BASE_URL and LLM_API_KEY,
    or with no LLM_BASE_URL the model Cairn runs itself (SmolLM2-135M, plus any model downloaded with
    `flask models pull`). Read-only in the app."""

    kind: str
    base_url: str
    api_key: str = field(repr=False)
    models: list[dict[str, Any]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    model_settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # none: read-only in the app
    id: None = None
    key: str = ENVIRONMENT
    checked_at: datetime | None = None
    last_error: str | None = None

    @property
    def name(self) -> str:
        return "Runs here (bundled)" if self.kind == "local" else "From the environment"


AnyConnection = Connection | EnvironmentConnection


# Secrets at rest ---------------------------------------------------------------------------------------------


def encrypt(text: str) -> str:
    return _fernet().encrypt(text.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretError(
            "A connection's key cannot be read: it was saved under another SECRET_KEY. Set the old one in "
            "SECRET_KEY_FALLBACKS, or enter the key again on the Connections page."
        ) from None


def rotate_secrets() -> int:
    """Encrypt every stored secret again under the current SECRET_KEY (after one was moved to
    SECRET_KEY_FALLBACKS); returns how many connections were rewritten."""
    fernet, count = _fernet(), 0
    for row in db.session.scalars(sa.select(Connection)):
        for column in ("api_key_secret", "headers_secret"):
            if token := getattr(row, column):
                try:
                    setattr(row, column, fernet.rotate(token.encode()).decode())
                except InvalidToken:
                    raise SecretError(
                        f"The connection {row.name!r} has a key saved under a secret that is neither SECRET_KEY "
                        "nor one of SECRET_KEY_FALLBACKS."
                    ) from None
        count += 1
    db.session.commit()
    return count


def _fernet() -> MultiFernet:
    settings = current_app.config
    secrets = [settings["SECRET_KEY"], *(settings.get("SECRET_KEY_FALLBACKS") or [])]
    return MultiFernet([Fernet(_derived_key(secret)) for secret in secrets])


def _derived_key(secret: str | bytes) -> bytes:
    """A Fernet key of its own, derived from the app's secret (HKDF-SHA256), so a leaked session-signing key and
    this one are not the same bytes."""
    material = secret.encode() if isinstance(secret, str) else secret
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"cairn connection secrets")
    return base64.urlsafe_b64encode(hkdf.derive(material))


def account_connections(account_id: int) -> list[Connection]:
    """The connections an account's admins added, by name."""
    return list(
        db.session.scalars(
            sa.select(Connection).where(Connection.account_id == account_id).order_by(Connection.name)
        )
    )


class Refused(ValueError):
    """A connection that cannot be saved or removed as asked; the message says why, `field` where."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


MAX_HEADERS = 10
HEADER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$")


def parse_headers(text: str) -> dict[str, str]:
    """Extra headers from lines of "Name: value" (blank lines skipped); Refused when a line is not one."""
    headers: dict[str, str] = {}
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        if not colon or not HEADER_NAME.match(name.strip()) or not value.strip():
            raise Refused(f'Line {number} is not a header: write one per line as "Name: value".', "headers")
        headers[name.strip()] = value.strip()
    if len(headers) > MAX_HEADERS:
        raise Refused(f"At most {MAX_HEADERS} extra headers.", "headers")
    return headers


def check_address(base_url: str) -> str:
    """The address as stored (no trailing slash); Refused unless it is an http(s) URL with a host."""
    url = (base_url or "").strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused(
            "The address must start with http:// or https://, such as https://openrouter.ai/api/v1.",
            "base_url",
        )
    if parts.username or parts.password:
        raise Refused("Put the key in the key field, not in the address.", "base_url")
    return url


def add(
    account_id: int, *, name: str, kind: str, base_url: str, api_key: str = "", headers: dict | None = None
) -> Connection:
    """A new connection of the account (not committed); Refused when a field is not right."""
    connection = Connection(account_id=account_id, kind=_kind(kind), models=[], model_settings={})
    change(connection, name=name, base_url=base_url, api_key=api_key, headers=headers)
    db.session.add(connection)
    return connection


def change(
    connection: Connection,
    *,
    name: str,
    base_url: str,
    api_key: str | None = None,
    headers: dict | None = None,
) -> None:
    """Rename it, move it, replace its key (None or empty: keep it) or its headers (None: keep them)."""
    name = " ".join((name or "").split())
    if not name or len(name) > MAX_NAME_CHARS:
        raise Refused(f"Give it a name of 1 to {MAX_NAME_CHARS} characters.", "name")
    taken = db.session.scalar(
        sa.select(Connection.id).where(
            Connection.account_id == connection.account_id,
            sa.func.lower(Connection.name) == name.lower(),
            Connection.id != (connection.id or -1),
        )
    )
    if taken:
        raise Refused("Another connection already has this name.", "name")
    address = check_address(base_url)
    if connection.base_url and address != connection.base_url:
        connection.models, connection.models_fetched_at = [], None  # another server: its list is unknown
    connection.name, connection.base_url = name, address
    if api_key:
        connection.api_key = api_key
    if headers is not None:
        connection.headers = headers


def remove(connection: Connection) -> None:
    """Delete it; Refused while an agent, the account's background model or its embedder uses it (the message
    names them)."""
    users = db.session.scalars(
        sa.select(Agent.name).where(Agent.connection_id == connection.id).order_by(Agent.name)
    ).all()
    if users:
        raise Refused(
            f"{', '.join(users)} {'uses' if len(users) == 1 else 'use'} it: give them another model first."
        )
    account = db.session.get(Account, connection.account_id)
    if account.background_connection_id == connection.id:
        raise Refused("Memory jobs use it: choose another background model first.")
    # The account's embedder, and while its vectors are written the one search ranks by meanwhile.
    if any(
        (c or "").startswith(f"{connection.id}|")
        for c in (account.embedding_choice, account.embedding_searched)
    ):
        raise Refused("Search by meaning uses it: choose another embedding model first.")
    db.session.delete(connection)


def _kind(kind: str) -> str:
    if kind not in ("openai", "ollama"):
        raise Refused("Choose OpenAI-compatible or Ollama.", "kind")
    return kind
