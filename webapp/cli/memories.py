"""`flask memories ...`: run the memory jobs on demand and backfill derived columns."""

import sys

import click
import sqlalchemy as sa
from flask.cli import AppGroup

from webapp import search
from webapp.extensions import db
from webapp.jobs.consolidation import (
    consolidate_chat,
    consolidate_stale_chats,
    idle_threshold,
    stale_chats_query,
)
from webapp.jobs.queue import enqueue
from webapp.jobs.refinement import agents_due_query, refine_agent, refine_due
from webapp.jobs.reflection import agents_to_reflect_query, reflect_agent, reflect_all
from webapp.llm import LLMError
from webapp.models import Agent, AgentMemory
from webapp.models.audit import dedup_for_agent
from webapp.timeutil import utcnow

memories_cli = AppGroup("memories", help="Agents' memories: consolidation, reflection, backfills.")
BACKFILL_BATCH = 500


def _run_or_enqueue(func, args: tuple, now: bool, label: str) -> bool:
    """Run the job inline (now) or queue it; False when an inline run failed, which it says, and why."""
    if not now:
        enqueue(func, *args)
        db.session.commit()
        click.echo(f"{label}: enqueued")
        return True
    try:
        click.echo(f"{label}: {func(*args)}")
    except LLMError as error:  # the run is recorded as failed, with its reason (and counts) in job_runs
        click.echo(f"{label}: failed: {error}", err=True)
        if counts := getattr(error, "counts", None):
            click.echo(f"{label}: counts of the failed run: {counts}", err=True)
        return False
    return True


def _run_each(func, ids: list[int], label: str) -> None:
    """Run the job inline for each id, going on past a failure; exit 1 if any failed."""
    results = [_run_or_enqueue(func, (found,), True, f"{label} {found}") for found in ids]
    if not all(results):
        sys.exit(1)


def _run_one(func, args: tuple, now: bool, label: str) -> None:
    if not _run_or_enqueue(func, args, now, label):
        sys.exit(1)


@memories_cli.command("consolidate")
@click.option(
    "--chat",
    "chat_id",
    type=int,
    help="One chat (default: every idle chat, group or one-to-one, that needs it).",
)
@click.option("--now", is_flag=True, help="Run inline instead of through the worker.")
def consolidate(chat_id: int | None, now: bool) -> None:
    """Consolidate idle chats into their agents' memories (with --now: exit 1 if an agent's extraction failed)."""
    if chat_id is not None:
        _run_one(consolidate_chat, (chat_id,), now, f"chat {chat_id}")
    elif not now:
        _run_one(consolidate_stale_chats, (), now, "finder")
    else:
        _run_each(
            consolidate_chat, db.session.scalars(stale_chats_query(utcnow(), idle_threshold())).all(), "chat"
        )


@memories_cli.command("reflect")
@click.option("--agent", "agent_id", type=int, help="One agent (default: every agent with recent journal).")
@click.option("--now", is_flag=True, help="Run inline instead of through the worker.")
def reflect(agent_id: int | None, now: bool) -> None:
    """Let agents promote journal entries to core memories."""
    if agent_id is not None:
        _run_one(reflect_agent, (agent_id,), now, f"agent {agent_id}")
    elif not now:
        _run_one(reflect_all, (), now, "finder")
    else:
        _run_each(reflect_agent, db.session.scalars(agents_to_reflect_query(utcnow())).all(), "agent")


@memories_cli.command("refine")
@click.option(
    "--agent", "agent_id", type=int, help="One agent, refined even if not due (default: every due agent)."
)
@click.option("--now", is_flag=True, help="Run inline instead of through the worker.")
def refine(agent_id: int | None, now: bool) -> None:
    """Run memory refinement sessions."""
    if agent_id is not None:
        _run_one(refine_agent, (agent_id, True), now, f"agent {agent_id}")
    elif not now:
        _run_one(refine_due, (), now, "finder")
    else:
        _run_each(refine_agent, db.session.scalars(agents_due_query(utcnow())).all(), "agent")


@memories_cli.command("dedup")
@click.option("--agent", "agent_id", type=int, help="One agent (default: every agent).")
def dedup(agent_id: int | None) -> None:
    """Soft-delete repeated core memories (the oldest copy and constitutional ones stay), with audit rows."""
    agent_ids = [agent_id] if agent_id is not None else db.session.scalars(sa.select(Agent.id)).all()
    for found in agent_ids:
        click.echo(f"agent {found}: {dedup_for_agent(found, session_id=None, via='cli')} duplicates removed")


@memories_cli.command("backfill")
def backfill() -> None:
    """Compute content_hash and token_estimate for memories that lack them, in batches."""
    missing = sa.or_(AgentMemory.content_hash.is_(None), AgentMemory.token_estimate.is_(None))
    total = db.session.scalar(sa.select(sa.func.count()).where(missing))
    done = 0
    while batch := db.session.scalars(sa.select(AgentMemory).where(missing).limit(BACKFILL_BATCH)).all():
        for memory in batch:
            memory.content = memory.content  # the validator recomputes the hash and the token count
        db.session.commit()
        done += len(batch)
        click.echo(f"backfilled {done}/{total}")
    click.echo(f"Done: {done} memories updated.")


@memories_cli.command("reindex")
def reindex() -> None:
    """Rebuild the full-text search index (recall, ledger search) of memories and messages from the tables."""
    for table, rows in search.rebuild().items():
        click.echo(f"{table}: {rows:,} rows indexed")


COMMANDS = [memories_cli]
