"""Summary CLI commands (spec 003): generate the agents' missing conversation summaries."""

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from webapp.cli.options import agent_option, now_option
from webapp.extensions import db
from webapp.jobs.queue import enqueue
from webapp.jobs.summaries import summarize
from webapp.llm import LLMError
from webapp.models import Agent, Chat, ChatAgent
from webapp.models.chats import ACTIVE_WINDOW
from webapp.timeutil import utcnow

summaries_cli = AppGroup("summaries", help="Agents' summaries of their conversations.")


def _missing(agent_id: int | None) -> list[ChatAgent]:
    """Agents' rows in active chats (not discarded, a message within 6 hours) that have no summary yet."""
    query = (
        sa.select(ChatAgent)
        .join(Chat, Chat.id == ChatAgent.chat_id)
        .join(Agent, Agent.id == ChatAgent.agent_id)
        .where(
            sa.func.trim(sa.func.coalesce(ChatAgent.agent_summary, "")) == "",
            Chat.discarded_at.is_(None),
            Chat.last_message_at > utcnow() - ACTIVE_WINDOW,
            Agent.paused.is_(False),
        )
        .order_by(ChatAgent.id)
    )
    if agent_id is not None:
        query = query.where(ChatAgent.agent_id == agent_id)
    return list(db.session.scalars(query))


@summaries_cli.command("backfill")
@agent_option(help="Only this agent: its name, slug or id.")
@now_option("Generate inline instead of enqueueing one job per summary.")
def backfill(agent: Agent | None, now: bool) -> None:
    """Generate the missing summaries of active conversations (enqueued for the workers unless --now)."""
    missing = [(row.chat_id, row.agent_id) for row in _missing(agent.id if agent else None)]
    if not now:
        for chat_id, row_agent_id in missing:
            enqueue(summarize, chat_id, row_agent_id)
        db.session.commit()
        click.echo(f"{len(missing)} missing summaries: enqueued {len(missing)} jobs.")
        return
    generated = failed = 0
    for chat_id, row_agent_id in missing:
        try:
            generated += summarize(chat_id, row_agent_id).get("summarized", 0)
        except LLMError as error:
            failed += 1
            click.echo(f"chat {chat_id}, agent {row_agent_id}: {error}", err=True)
    skipped = len(missing) - generated - failed
    click.echo(
        f"{len(missing)} missing summaries: {generated} generated, {skipped} skipped, {failed} failed."
    )


COMMANDS = [summaries_cli]
