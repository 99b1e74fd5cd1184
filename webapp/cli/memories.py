"""`flask memories ...`: run the memory jobs on demand, decide proposals of staged refinement sessions, and
backfill derived columns."""

import sys

import click
import sqlalchemy as sa
from flask.cli import AppGroup
from sqlalchemy.orm import contains_eager

from webapp import search
from webapp.cli.options import agent_option, now_option
from webapp.extensions import db
from webapp.jobs.consolidation import (
    consolidate_chat,
    consolidate_stale_chats,
    idle_threshold,
    stale_chats_query,
)
from webapp.jobs.embeddings import no_vectors_reason
from webapp.jobs.queue import enqueue
from webapp.jobs.refinement import agents_due_query, refine_agent, refine_due
from webapp.jobs.reflection import agents_to_reflect_query, reflect_agent, reflect_all
from webapp.llm import LLMError
from webapp.models import Account, Agent, AgentMemory, AuditLog, Chat, MemoryProposal, User
from webapp.models.audit import dedup_for_agent, record_change
from webapp.models.memory_changes import session_limits
from webapp.models.proposals import ProposalRefused, expire_proposals, outcome_words, pending
from webapp.models.search import EMBEDDED_KINDS
from webapp.search import indexing
from webapp.search.embedder import EmbeddingError
from webapp.timeutil import utcnow

memories_cli = AppGroup(
    "memories", help="Agents' memories: consolidation, reflection, refinement and its proposals, backfills."
)
BACKFILL_BATCH = 500
SEARCHED_TABLES = ("agent_memories", "messages")
PLURAL = {"memory": "memories", "message": "messages"}


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
@now_option()
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
@agent_option(help="One agent, by name, slug or id (default: every agent with recent journal).")
@now_option()
def reflect(agent: Agent | None, now: bool) -> None:
    """Let agents promote journal entries to core memories."""
    if agent is not None:
        _run_one(reflect_agent, (agent.id,), now, f"agent {agent.id}")
    elif not now:
        _run_one(reflect_all, (), now, "finder")
    else:
        _run_each(reflect_agent, db.session.scalars(agents_to_reflect_query(utcnow())).all(), "agent")


@memories_cli.command("refine")
@agent_option(help="One agent, by name, slug or id, refined even if not due (default: every due agent).")
@now_option()
def refine(agent: Agent | None, now: bool) -> None:
    """Run memory refinement sessions."""
    if agent is not None:
        _run_one(refine_agent, (agent.id, True), now, f"agent {agent.id}")
    elif not now:
        _run_one(refine_due, (), now, "finder")
    else:
        _run_each(refine_agent, db.session.scalars(agents_due_query(utcnow())).all(), "agent")


@memories_cli.command("dedup")
@agent_option(help="One agent, by name, slug or id (default: every agent).")
def dedup(agent: Agent | None) -> None:
    """Soft-delete repeated core memories (the oldest copy and constitutional ones stay), with audit rows."""
    agent_ids = [agent.id] if agent is not None else db.session.scalars(sa.select(Agent.id)).all()
    for found in agent_ids:
        click.echo(f"agent {found}: {dedup_for_agent(found, session_id=None, via='cli')} duplicates removed")


@memories_cli.command("proposals")
@agent_option(help="Only this agent's proposals: its name, slug or id.")
@click.option(
    "--approve", "approve_id", type=int, metavar="ID", help="Apply this proposal's changes, or --only some."
)
@click.option(
    "--only",
    type=int,
    multiple=True,
    metavar="CHANGE",
    help="With --approve: apply this change only (repeat it).",
)
@click.option("--reject", "reject_id", type=int, metavar="ID", help="Reject every change of this proposal.")
@click.option("--by", "by_email", metavar="EMAIL", help="The admin deciding, named in the audit log.")
def proposals(
    agent: Agent | None,
    approve_id: int | None,
    only: tuple[int, ...],
    reject_id: int | None,
    by_email: str | None,
) -> None:
    """List the proposals waiting for review, with their change ids; or decide one as the review page does: the
    changes approved (all, or --only those) are applied if they still apply, the rest rejected."""
    if approve_id is not None and reject_id is not None:
        raise click.UsageError("Give --approve or --reject, not both.")
    if only and approve_id is None:
        raise click.UsageError("--only goes with --approve.")
    now = utcnow()
    if expire_proposals(now):
        db.session.commit()
    if approve_id is None and reject_id is None:
        _list_proposals(agent, now)
        return
    proposal = _proposal(approve_id or reject_id, agent)
    changes = {change.id for change in proposal.changes}
    if unknown := sorted(set(only) - changes):
        raise click.ClickException(f"Proposal {proposal.id} has no change {', '.join(map(str, unknown))}.")
    chosen = set() if reject_id is not None else set(only) or changes
    person = _admin(by_email, proposal.account_id) if by_email else None
    try:
        outcome = proposal.decide(
            chosen, user_id=person.id if person else None, via="cli", now=now, **session_limits()
        )
    except ProposalRefused as refusal:
        db.session.rollback()
        raise click.ClickException(str(refusal)) from None
    db.session.commit()
    click.echo(f"proposal {proposal.id}: {outcome_words(outcome)}")
    for change in proposal.changes:
        if change.stale_reason:
            click.echo(f"  change {change.id} not applied: {change.stale_reason}")


def _list_proposals(agent: Agent | None, now) -> None:
    query = sa.select(MemoryProposal).where(pending(now)).order_by(MemoryProposal.id)
    if agent is not None:
        query = query.where(MemoryProposal.agent_id == agent.id)
    found = db.session.scalars(query).all()
    if not found:
        click.echo("No proposal waits for review.")
    for proposal in found:
        click.echo(
            f"proposal {proposal.id} · {proposal.agent.name} (agent {proposal.agent_id}) · proposed "
            f"{proposal.created_at:%Y-%m-%d %H:%M} UTC · expires {proposal.expires_at:%Y-%m-%d} · core tokens "
            f"{proposal.tokens_before:,} → {proposal.tokens_after:,} (budget {proposal.budget:,})"
        )
        problems = proposal.problems()
        for change in proposal.changes:
            click.echo(f"  change {change.id}: {_described(change)}")
            if problems[change.id]:
                click.echo(f"    stale now: {problems[change.id]}")


def _described(change) -> str:
    ids = ", ".join(f"#{memory_id}" for memory_id in change.memory_ids)
    was = " | ".join(_short(change.before(memory_id)["content"]) for memory_id in change.memory_ids)
    into = f" into {_short(change.content)!r}" if change.content else ""
    copy = f" (an exact copy of #{change.duplicate_of})" if change.duplicate_of else ""
    return f"{change.kind} {ids}{copy}{into}; was: {was}"


def _short(text: str, length: int = 80) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"


def _proposal(proposal_id: int, agent: Agent | None) -> MemoryProposal:
    proposal = db.session.get(MemoryProposal, proposal_id)
    if proposal is None or (agent is not None and proposal.agent_id != agent.id):
        raise click.ClickException(f"No proposal {proposal_id}" + (f" of {agent.name}." if agent else "."))
    return proposal


def _admin(email: str, account_id: int) -> User:
    """The admin of the proposal's account named by --by."""
    person = db.session.scalar(
        sa.select(User).where(User.email == email.strip().lower(), User.active_in(account_id))
    )
    if person is None or not person.is_admin:
        raise click.ClickException(f"{email} is no admin of this proposal's account.")
    return person


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


@memories_cli.command("backfill-audience")
def backfill_audience() -> None:
    """Tie the memories made before memories had an audience to the chat each came from (its creation audit
    row says which), to be heard by whoever may read that chat. Chats made before chats had people are shared,
    so nothing heard today goes quiet. Safe to run again: what is tied stays as it is."""
    tied = private = 0
    while batch := db.session.execute(_untied().limit(BACKFILL_BATCH)).all():
        for memory, chat in batch:
            if memory.chat_id is not None:  # a second creation row for the same memory
                continue
            before = memory.snapshot()
            memory.chat_id, memory.audience = chat.id, "chat"
            record_change(memory, "memory_audience", before, via="backfill-audience", chat_id=chat.id)
            private += chat.is_private
        db.session.commit()
        tied += len({memory.id for memory, _chat in batch})
        click.echo(f"tied {tied:,} so far")
    untraced = db.session.scalar(
        sa.select(sa.func.count()).select_from(AgentMemory).where(AgentMemory.chat_id.is_(None))
    )
    if tied:
        click.echo(
            f"Done: {_count(tied, 'memory')} tied to the chats they came from: {tied - private:,} of shared "
            f"chats (heard by everyone, as before), {private:,} of private chats (heard by their people)."
        )
    else:
        click.echo("Nothing to do: every memory whose chat is recorded is tied to it already.")
    click.echo(
        f"{_count(untraced, 'memory')} came from no recorded chat (an admin's entries, refinement merges, "
        "older rows): heard by everyone."
    )


def _untied() -> sa.Select:
    """(memory, chat) for each memory with no chat whose creation audit row names a chat of its account."""
    created_in = AuditLog.data["chat_id"].as_integer()
    return (
        sa.select(AgentMemory, Chat)
        .join(
            AuditLog,
            sa.and_(
                AuditLog.auditable_type == "AgentMemory",
                AuditLog.auditable_id == AgentMemory.id,
                AuditLog.action == "memory_create",
            ),
        )
        .join(Agent, Agent.id == AgentMemory.agent_id)
        .join(Chat, sa.and_(Chat.id == created_in, Chat.account_id == Agent.account_id))
        .where(AgentMemory.chat_id.is_(None))
        .order_by(AgentMemory.id)
        .options(contains_eager(AgentMemory.agent))
    )


@memories_cli.command("reindex")
@click.option(
    "--all", "everything", is_flag=True, help="Embed every memory and message again (after a model change)."
)
def reindex(everything: bool) -> None:
    """Rebuild every search index of memories and messages: full text, term statistics and vectors.

    Vectors are written for the rows lacking one of their account's chosen embedder, in committed batches: a run
    that was stopped continues where it stopped. An account whose new embedder's vectors are then all written
    searches by them from then on."""
    backend = search.backend()
    backend.rebuild_lexical(SEARCHED_TABLES)
    backend.refresh_term_stats()
    db.session.commit()
    for table in SEARCHED_TABLES:
        rows = db.session.scalar(sa.select(sa.func.count()).select_from(sa.table(table)))
        click.echo(f"{table}: {rows:,} rows indexed")
    if db.engine.dialect.name == "postgresql":
        click.echo("term statistics: refreshed")
    if not backend.vectors_available():
        click.echo(f"vectors: not available ({no_vectors_reason()})")
        return
    try:
        written = [_fill(account, everything) for account in db.session.scalars(sa.select(Account)).all()]
    except EmbeddingError as error:
        db.session.rollback()
        click.echo(f"vectors: failed: {error} What was written is kept: run it again to go on.", err=True)
        sys.exit(1)
    removed = sum(_remove_stale_vectors(kind) for kind in EMBEDDED_KINDS)
    db.session.commit()
    for account, counts in written:
        said = f"{account.name}: vectors ({counts['model']}): "
        if not any(counts[kind] for kind in EMBEDDED_KINDS):
            click.echo(said + "nothing missing")
        else:
            memories, messages = (_count(counts[kind], kind) for kind in EMBEDDED_KINDS)
            click.echo(said + f"{memories} and {messages} embedded")
        if counts["switched"]:
            click.echo(f"{account.name}: search now ranks by {counts['model']}")
    if removed:
        click.echo(f"vectors: {removed:,} removed (of deleted memories and of messages no longer readable)")


def _fill(account: Account, everything: bool) -> tuple[Account, dict]:
    """The account's vectors of its chosen embedder (indexing.fill), with a progress bar per kind."""
    bars: dict[str, tuple] = {}

    def step(kind: str, done: int, total: int) -> None:
        if kind not in bars:
            bar = click.progressbar(length=total, label=f"{account.name}: vectors of {PLURAL[kind]}")
            bars[kind] = (bar.__enter__(), 0)
        bar, shown = bars[kind]
        bar.update(done - shown)
        bars[kind] = (bar, done)

    try:
        return account, indexing.fill(account, everything, step)
    finally:
        for bar, _shown in bars.values():
            bar.__exit__(None, None, None)


def _count(number: int, kind: str) -> str:
    return f"{number:,} {kind if number == 1 else PLURAL[kind]}"


def _vectors(kind: str) -> tuple[sa.TableClause, sa.ColumnClause]:
    """The table holding this kind's vectors, and its column of row ids."""
    name, key = search.backend().VECTOR_TABLES[kind][:2]
    table = sa.table(name, sa.column(key))
    return table, table.c[key]


def _remove_stale_vectors(kind: str) -> int:
    """Remove the vectors of rows no longer found (a deleted memory, a message gone or unfinished), whichever
    path made them so (a Core statement bypasses the embedding queue)."""
    vectors, key = _vectors(kind)
    if not sa.inspect(db.session.connection()).has_table(vectors.name):
        return 0
    model, conditions = indexing.searched_rows(kind)
    stale = db.session.scalars(
        sa.select(key).distinct().where(~sa.exists().where(model.id == key, *conditions))
    ).all()
    search.backend().delete_vectors(kind, list(stale))
    return len(stale)


COMMANDS = [memories_cli]
