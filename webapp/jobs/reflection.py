"""Spec 001: daily, each agent reads its core memories and numbered journal entries of the last 7 days,
and promotes the entries it chooses to core (the type changes; the content, the audience and the count stay).

Issue 44 (after issue 31, which asked one audience at a time): one request per page of entries, whatever their
audiences. A reflection only picks entries by number and a promoted entry keeps its own audience, so no entry's
words reach another audience through it; the core memories listed beside a page are only those every entry's
audience hears (heard by everyone, and the entries' own audience when they share one).
"""

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from flask import current_app

from webapp import llm
from webapp.extensions import db
from webapp.jobs.queue import backlog_time, enqueue, job_target, recorded_job
from webapp.jobs.refinement import trigger_if_over_budget
from webapp.llm import targets
from webapp.llm.jsonparse import parse_json_object
from webapp.llm.targets import ModelTarget
from webapp.models import Agent, AgentMemory
from webapp.models.access import EVERYONE, Audience, audiences_of
from webapp.models.audit import record_change
from webapp.models.memories import core_memories, recent_journal
from webapp.models.memory_budget import token_pages
from webapp.prompting import render
from webapp.prompting.build import memory_budget
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)


def agents_to_reflect_query(now: datetime) -> sa.Select:
    """Agents (not paused) with active journal entries of the last 7 days: one query."""
    has_journal = recent_journal(Agent.id, now).order_by(None).exists()
    return sa.select(Agent.id).where(Agent.paused.is_(False), has_journal).order_by(Agent.id)


@recorded_job("reflect_finder", "Find agents with a journal to reflect on", unique="active")
def reflect_all() -> dict[str, int]:
    """Enqueue one reflection per agent with something to reflect on."""
    agent_ids = db.session.scalars(agents_to_reflect_query(utcnow())).all()
    for agent_id in agent_ids:
        enqueue(reflect_agent, agent_id)
    db.session.commit()
    return {"agents": len(agent_ids)}


@recorded_job(
    "reflect",
    "Reflect on the journal",
    target=lambda agent_id: job_target(agent=agent_id),
    of=Agent,
    unique="active",
    timeout=backlog_time,
)
def reflect_agent(agent_id: int) -> dict[str, Any]:
    """Let one agent choose which of its recent journal entries become core memories.

    Entries are shown a page at a time, each page within the agent's memory budget (one request per page),
    beside the oldest core memories every entry of the page's audience hears that fit the same budget; every
    promotion carries this run's session id.
    """
    agent = db.session.get(Agent, agent_id)
    if agent is None or agent.paused:
        return {"skipped": 1}
    now = utcnow()
    entries = db.session.scalars(recent_journal(agent.id, now)).all()
    if not entries:
        return {"entries": 0, "promoted": 0}
    target = targets.for_background(agent)
    budget = memory_budget(target, agent)
    totals = {"entries": len(entries), "promoted": 0, "ignored": 0}
    session_id = str(uuid.uuid4())
    for page in token_pages(entries, budget):
        core = _core_listing(agent, list(audiences_of(page)), budget)
        for key, value in _reflect_on_page(agent, target, core, page, session_id).items():
            totals[key] = totals.get(key, 0) + value
    return totals


@dataclass
class CoreListing:
    """The core memories a reflection prompt lists (the oldest that fit the budget) and how many did not fit."""

    contents: list[str]
    left_out: int


def _core_listing(agent: Agent, audiences: list[Audience], budget: int) -> CoreListing:
    """The oldest core memories that every one of the audiences hears: those heard by everyone, and the audience's
    own when there is one."""
    own = [audiences[0].holds()] if len(audiences) == 1 else []
    heard = sa.or_(EVERYONE.holds(), *own)
    pages = token_pages(db.session.scalars(core_memories(agent.id).where(heard)).all(), budget)
    listed = pages[0] if pages else []  # the oldest, as in a reply's prompt
    return CoreListing([m.content for m in listed], sum(len(page) for page in pages[1:]))


def _reflect_on_page(
    agent: Agent, target: ModelTarget, core: CoreListing, entries: list[AgentMemory], session_id: str
) -> dict[str, int]:
    """One request: the model picks entries of this page to promote."""
    numbered = {i: m.id for i, m in enumerate(entries, start=1)}
    prompt = render(
        "reflection.txt",
        core_memories=core.contents,
        core_left_out=core.left_out,
        journal_entries=entries,
        numbers={memory_id: number for number, memory_id in numbered.items()},
    )
    agent_id = agent.id
    db.session.commit()  # no transaction stays open while the model thinks
    result = llm.complete(
        target,
        [{"role": "user", "content": prompt}],
        purpose="reflect",
        agent_id=agent_id,
        response_format={"type": "json_object"} if current_app.config["LLM_JSON_MODE"] else None,
    )
    parsed = parse_json_object(result.text)
    if parsed is None:
        return {"malformed": 1}
    chosen, ignored = chosen_numbers(parsed.get("promote"), len(entries))
    return {"promoted": _promote(agent_id, [numbered[n] for n in chosen], session_id), "ignored": ignored}


def chosen_numbers(value: Any, count: int) -> tuple[list[int], int]:
    """The valid entry numbers (1..count, each once, in order given) and how many others were ignored."""
    if not isinstance(value, list):
        return [], 0 if value in (None, []) else 1
    chosen: list[int] = []
    for item in value:
        number = _as_number(item)
        if number is not None and 1 <= number <= count and number not in chosen:
            chosen.append(number)
    return chosen, len(value) - len(chosen)


def _as_number(item: Any) -> int | None:
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return item
    if isinstance(item, str) and item.strip().isdigit():
        return int(item.strip())
    return None


def _promote(agent_id: int, ids: list[int], session_id: str) -> int:
    """Make the chosen entries core (still active journal entries only) and audit each, in one transaction."""
    if not ids:
        return 0
    # Write first: the UPDATE takes SQLite's write lock before anything is read in this transaction.
    promoted_ids = db.session.scalars(
        sa.update(AgentMemory)
        .where(AgentMemory.id.in_(ids), AgentMemory.memory_type == "journal", AgentMemory.is_active)
        .values(memory_type="core", updated_at=utcnow())
        .returning(AgentMemory.id)
        .execution_options(synchronize_session=False)
    ).all()
    for memory in db.session.scalars(sa.select(AgentMemory).where(AgentMemory.id.in_(promoted_ids))):
        record_change(
            memory,
            "memory_promote",
            {**memory.snapshot(), "memory_type": "journal"},
            via="reflection",
            session_id=session_id,
        )
    agent = db.session.get(Agent, agent_id)
    trigger_if_over_budget(agent)
    db.session.commit()
    log.info("agent %s promoted %s journal entries to core", agent_id, len(promoted_ids))
    return len(promoted_ids)
