"""`flask tools`: the tool servers (MCP) of an account, as the Tools page shows them (Admin, Tools). Secrets stay out
of the shell's history when read from the environment: `--env NAME` alone takes NAME's value from this shell's
environment, and CAIRN_TOOL_SECRETS holds more lines (NAME=value for a command, "Name: value" for an address).
A secret is never printed."""

import os

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from webapp.actions import tool_servers as actions
from webapp.cli.connections import ACCOUNT_HELP
from webapp.cli.connections import _account as account_named
from webapp.extensions import db
from webapp.models import Account
from webapp.models.tool_servers import DEFAULT_TIMEOUT_SECONDS, ToolServer, account_tool_servers

tools_cli = AppGroup("tools", help="Tool servers (MCP): list, add, test and remove them.")
SECRETS_VARIABLE = "CAIRN_TOOL_SECRETS"


def _server(account: Account, name: str) -> ToolServer:
    found = db.session.scalar(
        sa.select(ToolServer).where(ToolServer.account_id == account.id, ToolServer.name == name.strip())
    )
    if found is None:
        raise click.ClickException(f"{account.name!r} has no tool server named {name!r}.")
    return found


def _health(server: ToolServer) -> str:
    if not server.checked_at:
        return "not checked yet"
    when = f"checked {server.checked_at:%Y-%m-%d %H:%M} UTC"
    return f"up ({when})" if server.status == "ok" else f"down: {server.status_error} ({when})"


def _echo_tools(server: ToolServer) -> None:
    for tool in server.tools or []:
        said = f"Not offered: {tool['problem']}" if tool.get("problem") else (tool.get("description") or "")
        click.echo(f"  {tool['offered_name']}  {' '.join(said.split())[:120]}")


@tools_cli.command("list")
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def list_servers(account_name: str | None) -> None:
    """The account's tool servers, their health and tools (the names of their secrets, never the values)."""
    for server in account_tool_servers(account_named(account_name).id):
        secrets = ", ".join(server.secret_names or []) or "none"
        click.echo(
            f"{server.name}  {server.kind}  {server.where}  timeout {server.timeout_seconds} s  "
            f"secrets: {secrets}  {_health(server)}"
        )
        _echo_tools(server)


@tools_cli.command("add")
@click.argument("name")
@click.option("--command", default=None, help="The command to start (stdio).")
@click.option("--arg", "arguments", multiple=True, help="One argument of the command (repeatable).")
@click.option("--env", "environment", multiple=True, help="NAME=value, or NAME to take its value from here.")
@click.option("--url", default=None, help="Its address (streamable HTTP), e.g. https://mcp.example.com/mcp.")
@click.option("--header", "headers", multiple=True, help='An extra header, "Name: value" (repeatable).')
@click.option("--timeout", "timeout_seconds", default=DEFAULT_TIMEOUT_SECONDS, show_default=True, type=int)
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def add(
    name: str,
    command: str | None,
    arguments: tuple[str, ...],
    environment: tuple[str, ...],
    url: str | None,
    headers: tuple[str, ...],
    timeout_seconds: int,
    account_name: str | None,
) -> None:
    """Add a server with --command (and --arg, --env) or --url (and --header); kept only if it lists its tools."""
    if bool(command) == bool(url):
        raise click.UsageError("Give either --command or --url.")
    kind = "stdio" if command else "http"
    lines = [_from_here(line) for line in environment] if command else list(headers)
    lines += os.environ.get(SECRETS_VARIABLE, "").splitlines()
    account = account_named(account_name)
    try:
        server = actions.add(
            account.id,
            name=name,
            kind=kind,
            command=command,
            arguments=list(arguments),
            url=url,
            secrets=actions.parse_secrets(kind, "\n".join(lines)),
            timeout_seconds=timeout_seconds,
        )
    except actions.Refused as refusal:
        raise click.ClickException(str(refusal)) from None
    click.echo(f"Added {server.name!r}; it lists {len(server.tools)} tools:")
    _echo_tools(server)


def _from_here(line: str) -> str:
    """NAME=value as given; NAME alone becomes NAME=its value in this shell's environment."""
    if "=" in line:
        return line
    if line.strip() not in os.environ:
        raise click.UsageError(f"--env {line.strip()}: no such variable here (give NAME=value).")
    return f"{line.strip()}={os.environ[line.strip()]}"


@tools_cli.command("test")
@click.argument("name")
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def test(name: str, account_name: str | None) -> None:
    """Start the server afresh and list its tools; exits 1, saying what failed, when that fails."""
    server = _server(account_named(account_name), name)
    if why := actions.check(server):
        click.echo(f"{server.name} is down: {why}", err=True)
        raise SystemExit(1)
    click.echo(f"{server.name} is up; it lists {len(server.tools)} tools:")
    _echo_tools(server)


@tools_cli.command("remove")
@click.argument("name")
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def remove(name: str, account_name: str | None) -> None:
    """Remove a server with its secrets, taking its tools off every agent."""
    server = _server(account_named(account_name), name)
    agents = actions.remove(server)
    taken_off = f"; its tools were taken off {', '.join(agents)}" if agents else ""
    click.echo(f"Removed {name.strip()!r}{taken_off}.")


COMMANDS = [tools_cli]
