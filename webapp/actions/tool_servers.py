"""Tool servers as an admin manages them, for the Tools page (webapp.admin.tool_servers) and `flask tools` alike:
add one (kept only once it has listed its tools), check it again, change its timeout or secrets, remove it.

Each verb commits. A secret (an environment value, a header's value) is never in the words a verb returns or
raises: a failure is said by webapp.tool_servers.refresh, which takes them out.
"""

import re
from urllib.parse import urlsplit

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Agent
from webapp.models.connections import Refused as HeadersRefused
from webapp.models.connections import parse_headers
from webapp.models.tool_servers import (
    DEFAULT_TIMEOUT_SECONDS,
    KINDS,
    NAME_PATTERN,
    SEPARATOR,
    ToolServer,
    is_offered_name,
)
from webapp.tool_servers import refresh
from webapp.tool_servers.client import POOL

MAX_TIMEOUT_SECONDS = 300
MAX_ARGUMENTS = 50
MAX_ENVIRONMENT = 20
MAX_TEXT_CHARS = 500  # a command, an address (their columns' size)
ENVIRONMENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
NAME_RULE = (
    "Give it a name of 1 to 24 characters: lowercase letters, digits and hyphens, starting with a letter or a "
    "digit (its tools are offered as name__tool)."
)


class Refused(ValueError):
    """A tool server that cannot be saved as asked; the message says why, `field` where (None: the server
    itself, such as a command that did not start)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def parse_arguments(text: str | None) -> list[str]:
    """A command's arguments, one per line (blank lines skipped)."""
    arguments = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if len(arguments) > MAX_ARGUMENTS:
        raise Refused(f"At most {MAX_ARGUMENTS} arguments.", "arguments")
    return arguments


def parse_environment(text: str | None) -> dict[str, str]:
    """Environment values from lines of NAME=value (blank lines skipped); a refusal never quotes the line."""
    values: dict[str, str] = {}
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        name, equals, value = line.partition("=")
        if not equals or not ENVIRONMENT_NAME.match(name.strip()):
            raise Refused(
                f"Line {number} is not a variable: write one per line as NAME=value.", "environment"
            )
        values[name.strip()] = value.strip()
    if len(values) > MAX_ENVIRONMENT:
        raise Refused(f"At most {MAX_ENVIRONMENT} environment variables.", "environment")
    return values


def parse_secrets(kind: str, text: str | None) -> dict[str, str]:
    """What a server keeps secret from one text: its environment (a command) or its extra headers (an address)."""
    if kind == "stdio":
        return parse_environment(text)
    try:
        return parse_headers(text or "")
    except HeadersRefused as refusal:
        raise Refused(str(refusal), "headers") from None


def add(
    account_id: int,
    *,
    name: str,
    kind: str,
    command: str | None = None,
    arguments: list[str] | None = None,
    url: str | None = None,
    secrets: dict[str, str] | None = None,
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
) -> ToolServer:
    """A new server of the account, saved with the tools it lists; Refused when a field is wrong or the server
    cannot list its tools (then nothing is saved, and the message says what failed)."""
    server = ToolServer(account_id=account_id, name=_name(account_id, name), kind=_kind(kind), tools=[])
    if server.kind == "stdio":
        server.command, server.arguments = _command(command), list(arguments or [])
    else:
        server.url = _address(url)
    server.timeout_seconds = _timeout(timeout_seconds)
    server.secrets = secrets or {}
    db.session.add(server)
    db.session.flush()
    why, server_id = refresh(server), server.id
    POOL.forget(server_id)  # listed: this process (a page, a command) calls none of its tools
    if why:
        db.session.rollback()
        raise Refused(f"Nothing was saved: {why}")
    db.session.commit()
    return server


def check(server: ToolServer) -> str | None:
    """Start the server afresh and list its tools again, keeping them and its health; None, or what failed in
    words (its tools as last listed are kept)."""
    POOL.forget(server.id)
    why = refresh(server)
    POOL.forget(server.id)  # listed: this process (a page, a command) calls none of its tools
    db.session.commit()
    return why


def change(server: ToolServer, *, timeout_seconds: int, secrets: dict[str, str] | None = None) -> str | None:
    """Set its timeout and replace its secrets (None: keep them), then check it; None, or what failed."""
    server.timeout_seconds = _timeout(timeout_seconds)
    if secrets is not None:
        server.secrets = secrets
    return check(server)


def remove(server: ToolServer) -> list[str]:
    """Delete the server and take its tools off every agent of the account; the names of those agents."""
    prefix = f"{server.name}{SEPARATOR}"
    agents = db.session.scalars(
        sa.select(Agent).where(Agent.account_id == server.account_id).order_by(Agent.name)
    ).all()
    changed = []
    for agent in agents:
        kept = [name for name in agent.enabled_tools or [] if not name.startswith(prefix)]
        if kept != list(agent.enabled_tools or []):
            agent.enabled_tools = kept
            changed.append(agent.name)
    server_id = server.id
    db.session.delete(server)
    db.session.commit()
    POOL.forget(server_id)
    return changed


def enabled_by(account_id: int) -> dict[str, list[str]]:
    """The names of the agents that enable each server tool, by its offered name (one query)."""
    found: dict[str, list[str]] = {}
    rows = db.session.execute(
        sa.select(Agent.name, Agent.enabled_tools).where(Agent.account_id == account_id).order_by(Agent.name)
    )
    for agent_name, tools in rows:
        for tool in tools or []:
            if is_offered_name(tool):
                found.setdefault(tool, []).append(agent_name)
    return found


def _name(account_id: int, name: str | None) -> str:
    name = (name or "").strip()
    if not NAME_PATTERN.match(name):
        raise Refused(NAME_RULE, "name")
    taken = db.session.scalar(
        sa.select(ToolServer.id).where(ToolServer.account_id == account_id, ToolServer.name == name)
    )
    if taken:
        raise Refused("Another tool server already has this name.", "name")
    return name


def _kind(kind: str | None) -> str:
    if kind not in KINDS:
        raise Refused("Choose a command (stdio) or an address (streamable HTTP).", "kind")
    return kind


def _command(command: str | None) -> str:
    command = (command or "").strip()
    if not command or len(command) > MAX_TEXT_CHARS:
        raise Refused(f"Give the command to run (1 to {MAX_TEXT_CHARS} characters).", "command")
    return command


def _address(url: str | None) -> str:
    """The address as stored; Refused unless it is an http(s) URL with a host and no credentials."""
    url = (url or "").strip()
    try:
        parts = urlsplit(url)
    except ValueError:  # such as an unclosed [ of an IPv6 address
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > MAX_TEXT_CHARS:
        raise Refused(
            "The address must start with http:// or https://, such as https://mcp.example.com/mcp.", "url"
        )
    if parts.username or parts.password:
        raise Refused("Put a token in the extra headers, not in the address.", "url")
    return url


def _timeout(seconds: int | str | None) -> int:
    try:
        value = int(seconds)
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= MAX_TIMEOUT_SECONDS:
        raise Refused(f"The timeout must be 1 to {MAX_TIMEOUT_SECONDS} seconds.", "timeout_seconds")
    return value
