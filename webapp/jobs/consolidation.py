"""Spec 000: hourly, turn idle chats into memories, each agent extracting its own with its own model.

Group chats, and the one-to-one chats of agents that have not turned that off (issue 20), by the same job and
cursors. Extraction is shown the agent's memories, those it saved with save_memory while chatting included, and
an identical active memory is not added twice, so a fact is not stored again.

Corrected as DESIGN.md 5.1 says: progress is a cursor per agent (chat_agents.last_consolidated_message_id),
committed in the same transaction as the memories it produced, so a crash or retry never duplicates or skips;
a failed extraction leaves that agent's cursor in place and the job retries; the chat's own cursor moves only
when every agent is through. The agents of a chat are processed concurrently.

What comes of a chat is heard where that chat may be read (its memories have the chat as their audience), and
extraction is shown only the memories that may be heard in the chat, so no other chat's private memory is
copied into this one's.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from flask import current_app
from sqlalchemy.orm import joinedload

from webapp import llm
from webapp.extensions import db
from webapp.jobs.concurrency import cancelled, map_in_threads
from webapp.jobs.extraction import Extracted, chunk_messages, numbered_turns, parse_extraction
from webapp.jobs.queue import backlog_time, enqueue, job_target, recorded_job
from webapp.jobs.refinement import trigger_if_over_budget
from webapp.llm import LLMError, targets
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, Message
from webapp.models.access import memories_heard_in, remembered
from webapp.models.audit import record_change
from webapp.models.memories import (
    MEMORY_TYPES,
    active_memories,
    add_sources,
    content_hash_of,
)
from webapp.models.memory_budget import MemoryWithin, memories_within
from webapp.prompting import render
from webapp.prompting.build import memory_budget
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

log = logging.getLogger(__name__)


def _consolidated() -> sa.ColumnElement[bool]:
    """Which of a chat's agents consolidation serves (Chat and Agent in the query): every agent of a group chat,
    and in a one-to-one chat an agent that turns its one-to-one chats into memories; none in a temporary chat."""
    return sa.and_(
        remembered(), sa.or_(Chat.manual_responses.is_(True), Agent.consolidates_direct_chats.is_(True))
    )


def _served_links(chat_id: int) -> sa.Select:
    return (
        sa.select(ChatAgent)
        .join(ChatAgent.chat)
        .join(ChatAgent.agent)
        .where(ChatAgent.chat_id == chat_id, _consolidated())
        .order_by(ChatAgent.id)
    )


def stale_chats_query(now: datetime, idle: timedelta) -> sa.Select:
    """Chats with no message for `idle` that have messages after their consolidation cursor and an agent that
    consolidates them: one query."""
    last_id = sa.select(sa.func.max(Message.id)).where(Message.chat_id == Chat.id).scalar_subquery()
    served = sa.exists().where(ChatAgent.chat_id == Chat.id, Agent.id == ChatAgent.agent_id, _consolidated())
    return (
        sa.select(Chat.id)
        .where(
            served,
            Chat.discarded_at.is_(None),
            Chat.last_message_at <= now - idle,
            sa.func.coalesce(Chat.last_consolidated_message_id, 0) < last_id,
        )
        .order_by(Chat.id)
    )


def idle_threshold() -> timedelta:
    return timedelta(hours=current_app.config["CONSOLIDATION_IDLE_HOURS"])


@recorded_job("consolidate_finder", "Find idle chats to extract memories from", unique="active")
def consolidate_stale_chats() -> dict[str, int]:
    """Find the chats to consolidate and enqueue one job for each."""
    chat_ids = db.session.scalars(stale_chats_query(utcnow(), idle_threshold())).all()
    for chat_id in chat_ids:
        enqueue(consolidate_chat, chat_id)
    db.session.commit()
    return {"chats": len(chat_ids)}


COUNTS = ("chunks", "journal", "core", "duplicates", "malformed")


@dataclass
class AgentOutcome:
    agent_name: str
    chunks: int = 0
    journal: int = 0
    core: int = 0
    duplicates: int = 0
    malformed: int = 0
    error: LLMError | None = None

    def counts(self) -> dict[str, int]:
        """What this agent's extraction did, for the run's record (why it failed is in the run's error)."""
        return {key: getattr(self, key) for key in COUNTS} | ({"failed": 1} if self.error else {})


class ConsolidationFailed(LLMError):
    """Some agents' extraction failed; `counts` says what every agent did, the failed ones' saved chunks
    included, and is recorded with the failed run."""

    def __init__(self, failed: list[AgentOutcome], outcomes: list[AgentOutcome]):
        reasons = "; ".join(f"{o.agent_name}: {o.error}" for o in failed)
        super().__init__(
            f"{len(failed)} of {len(outcomes)} agents failed ({reasons})",
            retryable=any(o.error.retryable for o in failed),
        )
        self.counts = _counts(outcomes)


@recorded_job(
    "consolidate",
    "Extract memories from chat",
    target=lambda chat_id, force=False: job_target(chat=chat_id),
    of=Chat,
    unique="active",
    timeout=backlog_time,  # 100k-token chunks, a request each of up to LLM_TIMEOUT_SECONDS: see BACKLOG_CALLS
)
def consolidate_chat(chat_id: int, force: bool = False) -> dict[str, Any]:
    """Extract memories from one chat's new messages for each of its agents (force: even if not idle)."""
    chat = db.session.get(Chat, chat_id)
    links = db.session.scalars(_served_links(chat_id)).all()
    if chat is None or not links or not _eligible(chat, force):
        return {"skipped": 1}
    through_id = db.session.scalar(sa.select(sa.func.max(Message.id)).where(Message.chat_id == chat.id))
    pending = [
        link.id
        for link in links
        if not link.agent.paused and (link.last_consolidated_message_id or 0) < (through_id or 0)
    ]
    db.session.commit()  # no transaction stays open while the agents' models work
    outcomes = map_in_threads(
        lambda link_id: _consolidate_for_agent(link_id, through_id),
        pending,
        current_app.config["CONSOLIDATION_CONCURRENCY"],
    )
    if failed := [o for o in outcomes if o.error]:
        raise ConsolidationFailed(failed, outcomes)
    _mark_chat_consolidated(chat_id, through_id)
    _trigger_refinements(chat_id)
    return _counts(outcomes)


def _trigger_refinements(chat_id: int) -> None:
    for link in db.session.get(Chat, chat_id).chat_agents:
        trigger_if_over_budget(link.agent)
    db.session.commit()


def _eligible(chat: Chat, force: bool) -> bool:
    if chat.discarded_at is not None:
        return False
    last_at = db.session.scalar(sa.select(sa.func.max(Message.created_at)).where(Message.chat_id == chat.id))
    return last_at is not None and (force or last_at <= utcnow() - idle_threshold())


def _mark_chat_consolidated(chat_id: int, through_id: int | None) -> None:
    db.session.execute(
        sa.update(Chat)
        .where(Chat.id == chat_id)
        .values(last_consolidated_at=utcnow(), last_consolidated_message_id=through_id)
        .execution_options(synchronize_session=False)
    )
    db.session.commit()


def _counts(outcomes: list[AgentOutcome]) -> dict[str, Any]:
    """The run's counts: the agents, how many failed (if any), the totals, and each agent's own."""
    failed = sum(1 for o in outcomes if o.error)
    totals = {key: sum(getattr(o, key) for o in outcomes) for key in COUNTS}
    by_agent = {o.agent_name: o.counts() for o in outcomes}
    return {"agents": len(outcomes), **({"failed": failed} if failed else {}), **totals, "by_agent": by_agent}


def _consolidate_for_agent(link_id: int, through_id: int) -> AgentOutcome:
    """One agent's extraction over the messages after its cursor, chunk by chunk; runs in its own thread."""
    link = db.session.get(ChatAgent, link_id)
    agent = link.agent
    outcome = AgentOutcome(agent_name=agent.name)
    cursor = link.last_consolidated_message_id
    messages = _transcript_lines(link.chat_id, cursor or 0, through_id)
    identity, target, agent_id, chat_id = (
        agent.identity(),
        targets.for_background(agent),
        agent.id,
        link.chat_id,
    )
    budget = memory_budget(target, agent)
    db.session.commit()
    instructions = count_tokens(_prompt(identity, MemoryWithin(), ""))
    chunk_tokens = target.chunk_tokens(
        "CONSOLIDATION_CHUNK_TOKENS", targets.CONSOLIDATION_CHUNK_CAP, beside=budget + instructions
    )
    for chunk in chunk_messages(messages, chunk_tokens):
        if cancelled():  # the job was stopped (its time limit): the cursor stays after the last saved chunk
            return outcome
        # Read again for each chunk: it sees the memories the chunks before it added.
        # Those for everyone and the chat's own (heard wherever it is read): not the other chats' heard here.
        known = memories_within(agent_id, utcnow(), budget, heard_chats=[chat_id])
        prompt = _prompt(identity, known, numbered_turns(chunk))
        db.session.commit()  # no transaction stays open while the model thinks
        try:
            result = llm.complete(
                target,
                [{"role": "user", "content": prompt}],
                purpose="extract",
                agent_id=agent_id,
                chat_id=chat_id,
                response_format=_json_format(),
            )
        except LLMError as error:
            outcome.error = error  # this agent's cursor stays after its last saved chunk
            log.warning("extraction failed for agent %s in chat %s: %s", agent_id, chat_id, error)
            return outcome
        extracted = parse_extraction(result.text, [message_id for message_id, _ in chunk])
        if extracted is None:  # malformed output extracts nothing
            outcome.malformed += 1
            extracted = {kind: [] for kind in MEMORY_TYPES}
        try:
            _save_chunk(link_id, agent_id, chat_id, extracted, cursor, (chunk[0][0], chunk[-1][0]), outcome)
        except CursorMoved:
            log.info("consolidation of chat %s for agent %s was done by another run", chat_id, agent_id)
            return outcome
        cursor = chunk[-1][0]
        outcome.chunks += 1
    return outcome


def _prompt(identity: str, known: MemoryWithin, transcript: str) -> str:
    """The extraction request. It lists what the chat already gave (its earlier chunks and runs, what save_memory
    kept in it) and what the agent holds for everyone, which a conversation's memories would repeat; not every
    memory of the agent's other chats that may be heard here, each listed in its own chat's extraction (a chat
    shared with everyone hears them all: 52,127 of 442,210 prompt tokens in bench.memory_cost). An identical
    memory heard here is still not stored twice (_save_chunk)."""
    return render("consolidation_extract.txt", identity=identity, known=known, transcript=transcript)


def _json_format() -> dict[str, str] | None:
    return {"type": "json_object"} if current_app.config["LLM_JSON_MODE"] else None


def _transcript_lines(chat_id: int, after_id: int, through_id: int) -> list[tuple[int, str]]:
    """(message id, "Author: text") for the finished messages after the cursor, oldest first, each on one line
    (runs of spaces and line breaks as one space)."""
    messages = db.session.scalars(
        sa.select(Message)
        .options(joinedload(Message.user), joinedload(Message.agent))
        .where(
            Message.chat_id == chat_id,
            Message.id > after_id,
            Message.id <= through_id,
            Message.status == "done",
            Message.content != "",
        )
        .order_by(Message.id)
    )
    return [(m.id, f"{m.author_name}: {' '.join(m.content.split())}") for m in messages]


class CursorMoved(Exception):
    """Another run of the same chat moved this agent's cursor; this run stops for the agent."""


def _cursor_is(message_id: int | None) -> sa.ColumnElement[bool]:
    column = ChatAgent.last_consolidated_message_id
    return column.is_(None) if message_id is None else column == message_id


def _save_chunk(
    link_id: int,
    agent_id: int,
    chat_id: int,
    extracted: dict[str, list[Extracted]],
    from_message_id: int | None,
    chunk_range: tuple[int, int],
    outcome: AgentOutcome,
) -> None:
    """Add the chunk's new memories (heard where the chat may be read) and move the agent's cursor past it, in
    one transaction. A memory the chat already hears is not added again."""
    last_message_id = chunk_range[1]
    # The cursor update comes first: a write-first transaction takes SQLite's write lock before it reads.
    # It moves only from where this run found it, so a second run of the same chat cannot save twice.
    moved = db.session.execute(
        sa.update(ChatAgent)
        .where(ChatAgent.id == link_id, _cursor_is(from_message_id))
        .values(last_consolidated_message_id=last_message_id)
        .execution_options(synchronize_session=False)
    ).rowcount
    if not moved:
        db.session.rollback()
        raise CursorMoved(f"another run consolidated this chat for agent {agent_id} first")
    heard = memories_heard_in(db.session.get(Chat, chat_id))
    known = set(
        db.session.scalars(active_memories(agent_id).where(heard).with_only_columns(AgentMemory.content_hash))
    )
    for kind in MEMORY_TYPES:
        for memory in extracted[kind]:
            if content_hash_of(memory.content) in known:
                outcome.duplicates += 1
                continue
            known.add(content_hash_of(memory.content))
            _add_memory(agent_id, chat_id, chunk_range, memory, kind)
            setattr(outcome, kind, getattr(outcome, kind) + 1)
    db.session.commit()


def _add_memory(
    agent_id: int, chat_id: int, chunk_range: tuple[int, int], extracted: Extracted, kind: str
) -> None:
    """A new memory of the chat (heard by whoever may read it) with its sources; its provenance (the chat, the
    messages read and those it came from) in its creation audit row."""
    memory = AgentMemory(
        agent_id=agent_id, content=extracted.content, memory_type=kind, chat_id=chat_id, audience="chat"
    )
    db.session.add(memory)
    add_sources(memory, extracted.sources)
    first, last = chunk_range
    record_change(
        memory,
        "memory_create",
        None,
        via="consolidation",
        chat_id=chat_id,
        first_message_id=first,
        last_message_id=last,
        # The turns it names; one that named none came from the whole range read.
        **({"source_message_ids": extracted.sources} if extracted.named else {}),
    )
