"""`flask connections`: the model providers of an account (the page is Admin, Connections), and the rotation of
the secret their keys are encrypted under. A key is read from --key, or from CAIRN_CONNECTION_KEY so it stays out
of the shell's history; it is never printed."""

import os

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from webapp.cli.options import resolve_account
from webapp.extensions import db
from webapp.llm import providers, targets
from webapp.models import Account, Connection
from webapp.models import connections as connection_rows
from webapp.models.connections import Refused, SecretError

connections_cli = AppGroup("connections", help="Model providers: list, add, test and remove them.")
ACCOUNT_HELP = "The account (its name or id); default: the only account."


def _account(value: str | None) -> Account:
    if value:
        return resolve_account(value)
    accounts = db.session.scalars(sa.select(Account).limit(2)).all()
    if len(accounts) != 1:
        raise click.ClickException("Say which account with --account (its name or id).")
    return accounts[0]


def _connection(account: Account, name: str):
    """The account's connection of this name or id ("environment": the environment's)."""
    if name.strip().lower() == "environment":
        return targets.environment_connection()
    found = db.session.scalar(
        sa.select(Connection).where(
            Connection.account_id == account.id,
            sa.or_(
                sa.func.lower(Connection.name) == name.strip().lower(),
                sa.cast(Connection.id, sa.String) == name.strip(),
            ),
        )
    )
    if found is None:
        raise click.ClickException(f"{account.name!r} has no connection named {name!r}.")
    return found


@connections_cli.command("list")
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def list_connections(account_name: str | None) -> None:
    """The environment's connection and the account's, with their models and last check (never their keys)."""
    account = _account(account_name)
    environment = targets.environment_connection(listed=True)
    click.echo(
        f"environment  {environment.name}  {environment.kind}  {len(environment.models)} models listed here"
    )
    for row in connection_rows.account_connections(account.id):
        state = (
            "not checked" if not row.checked_at else (f"down: {row.last_error}" if row.last_error else "up")
        )
        click.echo(
            f"{row.id}  {row.name}  {row.kind}  {row.base_url}  key {row.masked_key}  {len(row.models)} models  {state}"
        )


@connections_cli.command("add")
@click.argument("name")
@click.option("--kind", type=click.Choice(["openai", "ollama"]), default="openai", show_default=True)
@click.option("--url", "base_url", required=True, help="Its address, e.g. https://openrouter.ai/api/v1.")
@click.option("--key", "api_key", default=None, help="Its API key (else CAIRN_CONNECTION_KEY).")
@click.option("--header", "headers", multiple=True, help='An extra header, "Name: value" (repeatable).')
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def add(
    name: str,
    kind: str,
    base_url: str,
    api_key: str | None,
    headers: tuple[str, ...],
    account_name: str | None,
) -> None:
    """Add a connection and list its models."""
    account = _account(account_name)
    try:
        connection = connection_rows.add(
            account.id,
            name=name,
            kind=kind,
            base_url=base_url,
            api_key=api_key or os.environ.get("CAIRN_CONNECTION_KEY", ""),
            headers=connection_rows.parse_headers("\n".join(headers)),
        )
    except Refused as refusal:
        raise click.ClickException(str(refusal)) from None
    db.session.flush()
    try:
        models = providers.refresh(connection)
        outcome = f"it lists {len(models)} models"
    except providers.ProviderError as error:
        outcome = f"its models could not be listed: {error}"
    db.session.commit()
    click.echo(f"Added {connection.name!r} (id {connection.id}); {outcome}.")


@connections_cli.command("test")
@click.argument("name")
@click.option("--model", default=None, help="The model to ask (default: the first it lists).")
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def test(name: str, model: str | None, account_name: str | None) -> None:
    """List its models and ask one for a word; exits 1 when that fails."""
    connection = _connection(_account(account_name), name)
    result = providers.test(connection, model)
    db.session.commit()
    for step in result.steps:
        click.echo(step)
    if not result.ok:
        raise SystemExit(1)


@connections_cli.command("remove")
@click.argument("name")
@click.option("--account", "account_name", default=None, help=ACCOUNT_HELP)
def remove(name: str, account_name: str | None) -> None:
    """Remove a connection no agent uses, with its key."""
    connection = _connection(_account(account_name), name)
    if connection.id is None:
        raise click.ClickException("The environment's connection is set by LLM_BASE_URL; change it there.")
    try:
        connection_rows.remove(connection)
    except Refused as refusal:
        raise click.ClickException(str(refusal)) from None
    db.session.commit()
    click.echo(f"Removed {connection.name!r}.")


@connections_cli.command("rotate-key")
def rotate_key() -> None:
    """Encrypt every stored key again under SECRET_KEY (after the old secret went to SECRET_KEY_FALLBACKS)."""
    try:
        count = connection_rows.rotate_secrets()
    except SecretError as error:
        raise click.ClickException(str(error)) from None
    click.echo(
        f"Encrypted the secrets of {count} connection{'' if count == 1 else 's'} again under SECRET_KEY."
    )


COMMANDS = [connections_cli]
