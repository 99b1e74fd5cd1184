"""`flask agents ...`: agents as files (export, import, the format's schema), and the list of agents."""

import json

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from webapp.agent_files.errors import AgentFileError, NameRefused
from webapp.agent_files.export import export_agent, record_export
from webapp.agent_files.restore import import_agent
from webapp.agent_files.schema import SCHEMA
from webapp.agent_files.validation import read
from webapp.cli.options import ACCOUNT_HELP, resolve_account, resolve_agent
from webapp.extensions import db
from webapp.models import Account, Agent, User

agents_cli = AppGroup("agents", help="Agents: list them, export one as a file, import one from a file.")


@agents_cli.command("list")
def agents_list() -> None:
    """Every agent: its id, name, slug and account."""
    rows = db.session.execute(sa.select(Agent, Account.name).join(Account).order_by(Account.name, Agent.name))
    for agent, account_name in rows:
        click.echo(f"{agent.id}  {agent.name}  ({agent.slug})  account {account_name!r}")


@agents_cli.command("export")
@click.argument("agent", metavar="NAME_OR_ID")
@click.option("--account", default=None, metavar="ACCOUNT", help=ACCOUNT_HELP)
@click.option(
    "--with-chats", is_flag=True, help="Include its chats (every one, private ones too) and replies' sources."
)
@click.option(
    "-o", "--output", type=click.File("w", encoding="utf-8"), default="-", help="A file (default: stdout)."
)
def agents_export(agent: str, account: str | None, with_chats: bool, output) -> None:
    """Write the agent as a cairn-agent JSON file: settings, every memory, its audit trail and sessions."""
    found = resolve_agent(agent, account)
    document = export_agent(found, with_chats=with_chats)
    json.dump(document, output, ensure_ascii=False, indent=2)
    output.write("\n")
    record_export(found, document, user=None, via="cli")
    db.session.commit()
    chats = sum(1 for chat in document["chats"] if chat["included"])
    click.echo(
        f"Exported {found.name}: {len(document['memories'])} memories, {len(document['audit'])} audit rows"
        + (f", {chats} chats." if with_chats else "."),
        err=True,
    )


@agents_cli.command("import")
@click.argument("file", type=click.File("rb"))
@click.option("--account", default=None, metavar="ACCOUNT", help="The account to import into (name or id).")
@click.option("--as", "name", default=None, metavar="NAME", help="Its name here (when the file's is taken).")
@click.option(
    "--by",
    "by_email",
    default=None,
    metavar="EMAIL",
    help="The admin the import acts as, whose (private) chats the imported chats become (default: the "
    "account's first admin).",
)
def agents_import(file, account: str | None, name: str | None, by_email: str | None) -> None:
    """Restore an agent from a cairn-agent file (or a Letta .af file; "-" reads stdin) as a new agent."""
    target = resolve_account(account) if account is not None else _only_account()
    by = _acting_admin(target, by_email)
    try:
        imported = import_agent(read(file.read()), target, name=name, by=by, via="cli")
    except NameRefused as refusal:
        raise click.ClickException(f"{refusal} Import it under another name with --as NAME.") from None
    except AgentFileError as refusal:
        raise click.ClickException(f"{refusal} Nothing was imported.") from None
    click.echo(f"{imported.summary()} Its id: {imported.agent.id}, in account {target.name!r}.")


def _only_account() -> Account:
    accounts = db.session.scalars(sa.select(Account).order_by(Account.id).limit(2)).all()
    if len(accounts) != 1:
        raise click.UsageError(
            "Say which account to import into with --account." if accounts else "No account yet."
        )
    return accounts[0]


def _acting_admin(account: Account, email: str | None) -> User | None:
    admins = sa.select(User).where(User.active_in(account.id), User.role == "admin").order_by(User.id)
    if email is None:
        return db.session.scalar(admins)
    admin = db.session.scalar(admins.where(User.email == email.strip().lower()))
    if admin is None:
        raise click.UsageError(f"{email} is not an admin of account {account.name!r}.")
    return admin


@agents_cli.command("schema")
def agents_schema() -> None:
    """Print the JSON Schema of the cairn-agent format (docs/cairn-agent.schema.json)."""
    click.echo(json.dumps(SCHEMA, indent=2, ensure_ascii=False))


COMMANDS = [agents_cli]
