"""Options several commands share: an agent named by its name, slug or id (`--agent`), in an account named by its
name or id (`--account`) when a name alone is ambiguous.

    @memories_cli.command("reflect")
    @agent_option(help="One agent (default: every agent with recent journal).")
    def reflect(agent: Agent | None) -> None: ...

A command that takes the agent as an argument calls resolve_agent(value, account) itself."""

import functools
from collections.abc import Callable
from typing import Any

import click
import sqlalchemy as sa
from redis.exceptions import RedisError

from webapp.extensions import db
from webapp.jobs.queue import unreachable_redis
from webapp.models import Account, Agent

AGENT_HELP = "An agent: its name, slug or id."
ACCOUNT_HELP = "The account (its name or id), when the agent's name is found in several."


def resolve_account(value: str) -> Account:
    """The account named `value` (or with that id); a clear error when there is none or several."""
    value = value.strip()
    query = sa.select(Account).where(Account.name == value).order_by(Account.id)
    found = list(db.session.scalars(query))
    if not found and value.isdigit() and (by_id := db.session.get(Account, int(value))):
        found = [by_id]
    if not found:
        raise click.ClickException(f"No account is named {value!r}.")
    if len(found) > 1:
        ids = ", ".join(str(account.id) for account in found)
        raise click.ClickException(f"Several accounts are named {value!r} (ids {ids}): give --account an id.")
    return found[0]


def resolve_agent(value: str, account: str | Account | None = None) -> Agent:
    """The agent `value` names: its id (digits), else its name, else its slug; within `account` (an Account,
    its name or its id) when given. Errors (click.ClickException) say what is missing or ambiguous."""
    value = value.strip()
    if isinstance(account, str):
        account = resolve_account(account)
    where = [Agent.account_id == account.id] if account is not None else []
    inside = f" in account {account.name!r}" if account is not None else ""
    if value.isdigit() and (
        agent := db.session.scalar(sa.select(Agent).where(Agent.id == int(value), *where))
    ):
        return agent
    for column in (Agent.name, Agent.slug):
        found = list(db.session.scalars(sa.select(Agent).where(column == value, *where).order_by(Agent.id)))
        if len(found) == 1:
            return found[0]
        if found:
            accounts = ", ".join(sorted({repr(agent.account.name) for agent in found}))
            raise click.ClickException(
                f"Agents named {value!r} are in several accounts ({accounts}): say which with --account."
            )
    if value.isdigit():
        raise click.ClickException(f"No agent with id {value}{inside}.")
    raise click.ClickException(f"No agent is named {value!r}{inside} (give its name, slug or id).")


def agent_option(*, required: bool = False, help: str = AGENT_HELP) -> Callable:
    """Adds `--agent NAME_OR_ID` and `--account A` to a command, which receives `agent` (an Agent, or None when
    the option was not given) instead of the two strings."""

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def resolved(*args: Any, agent: str | None, account: str | None, **kwargs: Any) -> Any:
            if agent is None and account is not None:
                raise click.UsageError("--account names the account of --agent; give --agent too.")
            found = resolve_agent(agent, account) if agent is not None else None
            return func(*args, agent=found, **kwargs)

        with_account = click.option("--account", default=None, metavar="ACCOUNT", help=ACCOUNT_HELP)(resolved)
        return click.option("--agent", required=required, metavar="NAME_OR_ID", help=help)(with_account)

    return decorate


def now_option(help: str = "Run inline instead of through the worker.") -> Callable[[Callable], Callable]:
    """`--now`: run a job here and now rather than queue it for a worker. A job run here still takes its run's
    lock in Redis: when Redis does not answer, the command says so in a sentence (not a traceback)."""

    def decorate(command: Callable) -> Callable:
        @click.option("--now", is_flag=True, help=help)
        @functools.wraps(command)
        def run(*args: Any, now: bool, **kwargs: Any) -> Any:
            try:
                return command(*args, now=now, **kwargs)
            except RedisError as error:
                raise click.ClickException(
                    f"{unreachable_redis(error)}. Start Redis (`make run` starts one) or set REDIS_URL, "
                    "then run the command again."
                ) from error

        return run

    return decorate
