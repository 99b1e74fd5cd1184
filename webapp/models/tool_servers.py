"""Tool servers: MCP servers an account's admins add, whose tools its agents may call in their replies.

A server is started as a command (stdio: the command, its arguments and environment) or reached at an address
(streamable HTTP, with extra headers). What it lists (`tools`) is kept here, refreshed on demand, so a reply never
asks for it. Its environment values and headers are secrets, stored encrypted as connections' keys are and never
shown again: a page shows their names only.

An agent enables a server's tool by its offered name, `server__tool` (offered_name), in `Agent.enabled_tools`
beside the built-in tools' names; a server removed or a tool no longer listed is simply not offered.
"""

import hashlib
import json
import re
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from webapp.extensions import JSON, db
from webapp.models.connections import decrypt, encrypt
from webapp.timeutil import utcnow

KINDS = ("stdio", "http")
KIND_NAMES = {"stdio": "Command (stdio)", "http": "Address (streamable HTTP)"}
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,23}$")
SEPARATOR = "__"  # between a server's name and its tool's in the name offered to a model
MAX_OFFERED_NAME = 64  # the providers' limit on a function's name
DEFAULT_TIMEOUT_SECONDS = 30


class ToolServer(db.Model):
    """An MCP server of an account, and the tools it listed at its last refresh."""

    __tablename__ = "tool_servers"
    __table_args__ = (sa.UniqueConstraint("account_id", "name", name="uq_tool_servers_account_id_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(sa.String(24))  # NAME_PATTERN; the prefix of its tools' offered names
    kind: Mapped[str] = mapped_column(
        sa.Enum(*KINDS, name="tool_server_kind", native_enum=False, create_constraint=True)
    )
    command: Mapped[str | None] = mapped_column(sa.String(500))  # stdio
    arguments: Mapped[list[str]] = mapped_column(JSON, default=list)  # stdio
    url: Mapped[str | None] = mapped_column(sa.String(500))  # http
    # Fernet token of {"name": "value"}: the environment (stdio) or the extra headers (http). Never shown.
    secrets_secret: Mapped[str | None] = mapped_column(sa.Text)
    secret_names: Mapped[list[str]] = mapped_column(JSON, default=list)  # what a page may show of them
    timeout_seconds: Mapped[int] = mapped_column(default=DEFAULT_TIMEOUT_SECONDS)
    # What it listed at the last refresh: [{"name", "description", "input_schema", "offered_name", "problem"}];
    # a tool with a problem (an input schema that is not a JSON Schema) is listed but never offered.
    tools: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    listed_at: Mapped[datetime | None] = mapped_column(sa.DateTime)
    # Its health as last seen by a call or a test: "ok" or "down" (with why), and when.
    status: Mapped[str | None] = mapped_column(sa.String(8))
    status_error: Mapped[str | None] = mapped_column(sa.Text)
    checked_at: Mapped[datetime | None] = mapped_column(sa.DateTime)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime, default=utcnow)

    @property
    def secrets(self) -> dict[str, str]:
        return json.loads(decrypt(self.secrets_secret)) if self.secrets_secret else {}

    @secrets.setter
    def secrets(self, values: dict[str, str]) -> None:
        self.secrets_secret = encrypt(json.dumps(values)) if values else None
        self.secret_names = sorted(values)

    @property
    def usable_tools(self) -> list[dict[str, Any]]:
        return [tool for tool in self.tools or [] if not tool.get("problem")]

    @property
    def where(self) -> str:
        """What it runs or reaches, in words, without a secret: the command line or the address."""
        if self.kind == "stdio":
            return " ".join([self.command or "", *(self.arguments or [])])
        return self.url or ""


def offered_name(server_name: str, tool_name: str) -> str:
    """`server__tool`, in the characters and length every provider takes (a name cut short ends in a hash of the
    whole, so two long names stay apart)."""
    name = f"{server_name}{SEPARATOR}{re.sub(r'[^A-Za-z0-9_-]', '_', tool_name)}"
    if len(name) <= MAX_OFFERED_NAME:
        return name
    digest = hashlib.sha256(tool_name.encode()).hexdigest()[:8]
    return f"{name[: MAX_OFFERED_NAME - 9]}_{digest}"


def is_offered_name(name: str) -> bool:
    return SEPARATOR in name


def account_tool_servers(account_id: int) -> list[ToolServer]:
    return list(
        db.session.scalars(
            sa.select(ToolServer).where(ToolServer.account_id == account_id).order_by(ToolServer.name)
        )
    )
