"""`flask mcp`: the MCP server for agents' memory, over stdio for a desktop client, or over HTTP (the process
that `make run` and deploy/cairn-mcp.service run)."""

import click
import sqlalchemy as sa
from flask import current_app
from flask.cli import AppGroup

from webapp.cli.options import ACCOUNT_HELP, AGENT_HELP, resolve_account, resolve_agent
from webapp.extensions import db
from webapp.models import Agent, User
from webapp.models.api_keys import key_for_bearer

mcp_cli = AppGroup("mcp", help="The MCP server for agents' memory.")


@mcp_cli.command("serve")
@click.option("--agent", "agent_name", required=True, metavar="NAME_OR_ID", help=AGENT_HELP)
@click.option("--account", default=None, metavar="ACCOUNT", help=ACCOUNT_HELP)
@click.option("--user", "email", default=None, help="The person it acts as: their e-mail.")
@click.option(
    "--key",
    envvar="CAIRN_API_KEY",
    default=None,
    help="Or an API key (better in the CAIRN_API_KEY variable): it acts as the key's person while the key lives.",
)
def serve(agent_name: str, account: str | None, email: str | None, key: str | None) -> None:
    """Serve one agent's memory over stdio (for a desktop assistant), acting as one person."""
    from webapp.mcp.server import Caller, build_server  # the SDK takes seconds to import: only when serving

    user = _person(email, key)
    agent = _agent(agent_name, account, user)
    caller = Caller(agent.id, user_id=None if key else user.id, key=key)
    click.echo(
        f"Serving {agent.name}'s memory (memory://{agent.slug}/core) as {user.email} over stdio.", err=True
    )
    app, slug = current_app._get_current_object(), agent.slug
    db.session.remove()  # the tools use sessions of their own; hold no transaction open meanwhile
    build_server(app, caller, agent_slug=slug).run("stdio")


@mcp_cli.command("http")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=None, help="Default: the MCP_PORT setting (8002).")
def serve_http(host: str, port: int | None) -> None:
    """Serve every agent's memory over streamable HTTP at /mcp/<agent-slug>, with API keys."""
    from webapp.mcp import http

    app = current_app._get_current_object()
    port = port or app.config["MCP_PORT"]
    click.echo(f"MCP server at http://{host}:{port}/mcp/<agent-slug>", err=True)
    db.session.remove()
    http.serve(app, host, port)


def _person(email: str | None, key: str | None) -> User:
    """The person the server acts as: named by --user, or the person of the live key --key."""
    if (email is None) == (key is None):
        raise click.UsageError("Say who it acts as: --user EMAIL, or --key (or CAIRN_API_KEY), not both.")
    if key is not None:
        found = key_for_bearer(f"Bearer {key}")
        if found is None:
            raise click.ClickException("That API key is unknown or revoked.")
        return found.user
    user = db.session.scalar(sa.select(User).where(User.email == email.strip().lower()))
    if user is None or user.is_removed:
        raise click.ClickException(f"No one signs in with {email}.")
    return user


def _agent(value: str, account: str | None, user: User) -> Agent:
    """The agent --agent names in the person's account (--account, if given, must be theirs)."""
    scope = resolve_account(account) if account is not None else user.account
    if scope.id != user.account_id:
        raise click.ClickException(f"{user.email} is not in account {scope.name!r}.")
    return resolve_agent(value, scope)


COMMANDS = [mcp_cli]
