"""Spec 002: an agent refines its own core memory under a token budget, in an audited tool loop.

Weekly (Monday 04:00 UTC) for agents that need it, on demand for one agent, and when an agent's core memory
goes over budget (at most once a day per agent). Issue 23: when the agent's background changes are staged (its
setting, or the drift alarm), the session's merges, rewrites and deletes, and dedup's removals, end as a
proposal for an admin; no session starts while one of the agent's proposals waits, and the prompt lists the
changes refused before.

Issue 31: a session works within one audience at a time, so nothing read in a private chat's memories is
written where others hear it. It runs one pass of the tool loop per audience of the agent's core memories (the
largest first), each pass's prompt listing only that audience's memories; the token budget is split between
them in proportion to their tokens, so every audience compressed to its share keeps the whole within budget.
The passes share the session's turns, cap and floor, its audit rows and its one proposal.
"""

import uuid
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from flask import current_app

from webapp.extensions import db
from webapp.jobs.queue import enqueue, job_target, model_time, recorded_job, target_ids
from webapp.llm import LLMError, targets
from webapp.llm.tool_loop import run_tool_loop
from webapp.models import Agent, AgentMemory, AuditLog, JobRun
from webapp.models.access import Audience, audiences_of
from webapp.models.audit import ROLLED_BACK, dedup_for_agent, duplicates, session_rows
from webapp.models.drift import drift_of
from webapp.models.memories import core_memories, core_token_usage, core_tokens, needs_refinement
from webapp.models.memory_changes import ProposedChange, staging
from webapp.models.proposals import expire_proposals, pending_proposal, refused_changes
from webapp.prompting import render
from webapp.prompting.build import memory_budget
from webapp.prompting.window import fit_to_budget
from webapp.timeutil import utcnow
from webapp.tools import RefinementSession, run_tool_call, schemas_for
from webapp.tools.refine_memory import TOOL
from webapp.tools.refinement import VIA

REFINE_EVERY = timedelta(weeks=1)
TRIGGER_COOLDOWN_SECONDS = 86_400
START = "memory_refinement_start"
CLOSING = (
    "memory_refinement_complete",
    "memory_refinement_incomplete",
    ROLLED_BACK,
    "memory_refinement_interrupted",
)


def agents_due_query(now: datetime) -> sa.Select:
    """Agents (not paused, no proposal waiting) not refined for a week, or whose active core memory is over
    budget: one query."""
    core_tokens_now = core_tokens(Agent.id).scalar_subquery()
    stale = sa.or_(Agent.last_refinement_at.is_(None), Agent.last_refinement_at < now - REFINE_EVERY)
    return (
        sa.select(Agent.id)
        .where(Agent.paused.is_(False), sa.or_(stale, core_tokens_now > Agent.core_token_budget))
        .where(~pending_proposal(Agent.id, now).exists())
        .order_by(Agent.id)
    )


@recorded_job("refine_finder", "Find agents due for refinement", unique="active")
def refine_due() -> dict[str, int]:
    """Mark proposals past their expiry expired; enqueue a refinement session for each agent that needs one."""
    expire_proposals(utcnow())
    db.session.commit()
    agent_ids = db.session.scalars(agents_due_query(utcnow())).all()
    for agent_id in agent_ids:
        enqueue(refine_agent, agent_id)
    db.session.commit()
    return {"agents": len(agent_ids)}


def trigger_if_over_budget(agent: Agent) -> bool:
    """Enqueue a refinement when the agent's core memory is over budget, at most once a day per agent (not
    while a proposal of its last session waits)."""
    if agent.paused or not needs_refinement(agent):
        return False
    if db.session.scalar(pending_proposal(agent.id, utcnow()).exists().select()):
        return False
    return enqueue(refine_agent, agent.id, once_per=TRIGGER_COOLDOWN_SECONDS) is not None


def _target(agent_id: int, force: bool = False) -> str:
    return job_target(agent=agent_id)


def _interrupted(run: JobRun, _again: bool) -> None:
    """Its worker died mid-session: close the session as interrupted, so it can be rolled back in one click."""
    [agent_id] = target_ids(run.target, "agent")
    agent = db.session.get(Agent, agent_id)
    for session_id in _open_sessions(agent.id, run.started_at):
        AuditLog.record(
            "memory_refinement_interrupted",
            agent,
            account_id=agent.account_id,
            agent_id=agent.id,
            session_id=session_id,
            reason="The worker running this session stopped before it finished.",
            mutations=len(session_rows(session_id)),
            tokens_after=core_token_usage(agent.id),
        )
    agent.last_refinement_at = utcnow()


def _open_sessions(agent_id: int, since: datetime) -> list[str]:
    """The agent's sessions started since `since` that have no closing row."""
    started = sa.select(AuditLog.session_id).where(
        AuditLog.agent_id == agent_id,
        AuditLog.auditable_type == "Agent",
        AuditLog.action == START,
        AuditLog.created_at >= since,
    )
    closed = sa.select(AuditLog.session_id).where(
        AuditLog.agent_id == agent_id, AuditLog.auditable_type == "Agent", AuditLog.action.in_(CLOSING)
    )
    return list(db.session.scalars(started.where(AuditLog.session_id.not_in(closed))))


# One session per agent at a time (two would each get the full mutation cap and floor): the job's target lock.
@recorded_job(
    "refine",
    "Refine core memory",
    target=_target,
    of=Agent,
    unique="active",
    resume=False,
    on_interrupt=_interrupted,
    timeout=lambda *_: model_time(current_app.config["REFINEMENT_MAX_TURNS"]),
)
def refine_agent(agent_id: int, force: bool = False) -> dict[str, Any]:
    """Dedup, then let the agent refine its core memory with the refinement tool (force: even if not due)."""
    agent = db.session.get(Agent, agent_id)
    if agent is None or agent.paused:
        return {"skipped": "no such agent, or paused"}
    return _refine(agent, force)


def _refine(agent: Agent, force: bool) -> dict[str, Any]:
    now, config = utcnow(), current_app.config
    if expire_proposals(now, agent.id):
        db.session.commit()
    if db.session.scalar(pending_proposal(agent.id, now)) is not None:
        return {"skipped": "a proposal of its last session awaits review"}
    session_id = str(uuid.uuid4())
    staged = staging(agent, now, config["DRIFT_ALARM_SHARE"])
    # Staged, exact copies are proposed for removal like any delete; else removed at once, as ever.
    copies = (
        []
        if not staged
        else [ProposedChange.build("delete", [d], duplicate_of=k) for d, k in duplicates(agent.id)]
    )
    deduplicated = len(copies) if staged else dedup_for_agent(agent.id, session_id=session_id, via=VIA)
    hidden = {change.memory_ids[0] for change in copies}
    memories = [m for m in db.session.scalars(core_memories(agent.id)) if m.id not in hidden]
    if not memories:
        return {"skipped": "no core memories", "deduplicated": deduplicated}
    usage, budget = core_token_usage(agent.id), agent.core_token_budget
    recently = agent.last_refinement_at and agent.last_refinement_at > now - REFINE_EVERY
    if not force and usage <= budget and recently:
        return {"skipped": "within budget and refined this week", "deduplicated": deduplicated}
    session = _start(agent, session_id, usage, budget, deduplicated, staged)
    session.proposed.extend(copies)
    _run_passes(session, audiences_of(memories), budget)
    counts = {
        "session_id": session_id,
        "status": session.status,
        "deduplicated": deduplicated,
        **session.stats,
    }
    return counts | ({"proposed": len(session.proposed)} if session.proposed else {})


def _run_passes(
    session: RefinementSession, audiences: dict[Audience, list[AgentMemory]], budget: int
) -> None:
    """One pass of the tool loop per audience, the largest first, sharing the session's turns (each pass gets
    an even share of what is left); then close the session if its last pass did not."""
    tokens = {
        audience: sum(m.token_estimate or 0 for m in memories) for audience, memories in audiences.items()
    }
    order = sorted(audiences, key=lambda audience: -tokens[audience])
    total, turns_left = sum(tokens.values()) or 1, current_app.config["REFINEMENT_MAX_TURNS"]
    for number, audience in enumerate(order):
        passes_left = len(order) - number
        if turns_left <= 0:
            break
        session.begin_pass(audience, passes_after=passes_left - 1)
        share = budget * tokens[audience] // total
        turns_left -= _tool_loop(session, _prompt(session, share), max(1, turns_left // passes_left))
        if session.finished:
            return
    session.close_unfinished(len(order))


def _prompt(session: RefinementSession, budget: int) -> str:
    """The pass's prompt: its audience's core memories (the first page), usage and share of the budget."""
    pages = session.pages()
    listed = [memory for page in pages for memory in page]  # none with a proposed change (dedup's copies)
    return render(
        "refinement.txt",
        count=len(listed),
        memories=pages[0] if pages else [],
        pages=len(pages),
        usage=sum(memory.token_estimate or 0 for memory in listed),
        budget=budget,
        max_mutations=session.max_mutations - session.mutations,
        floor_percent=round(session.floor * 100),
        staged=session.staged is not None,
        refused=_listed_refusals(_heard_by(session.audience, session.refused)),
    )


def _heard_by(audience: Audience, changes: list[ProposedChange]) -> list[ProposedChange]:
    """The changes whose memories are all heard by `audience` (only those may be quoted in its pass)."""
    ids = {memory_id for change in changes for memory_id in change.memory_ids}
    memories = db.session.scalars(sa.select(AgentMemory).where(AgentMemory.id.in_(ids))) if ids else []
    heard = {memory.id for memory in memories if Audience.of(memory) == audience}
    return [change for change in changes if set(change.memory_ids) <= heard]


def _start(
    agent: Agent, session_id: str, usage: int, budget: int, deduplicated: int, staged: tuple | None
) -> RefinementSession:
    config, now = current_app.config, utcnow()
    AuditLog.record(
        START,
        agent,
        account_id=agent.account_id,
        agent_id=agent.id,
        session_id=session_id,
        tokens_before=usage,
        budget=budget,
        deduplicated=deduplicated,
        **({"staged": staged[0]} if staged else {}),
    )
    db.session.commit()
    threshold = config["DRIFT_ALARM_SHARE"]
    return RefinementSession(
        agent=agent,
        session_id=session_id,
        start_tokens=usage,
        max_mutations=config["REFINEMENT_MAX_MUTATIONS"],
        floor=config["REFINEMENT_TOKEN_FLOOR"],
        page_tokens=memory_budget(targets.for_background(agent), agent),
        staged=staged,
        drift_alarm=lambda: _drift_reason(agent.id, threshold),
        refused=refused_changes(agent.id, now),
        proposal_expiry=timedelta(days=config["PROPOSAL_EXPIRY_DAYS"]),
    )


def _drift_reason(agent_id: int, threshold: float) -> str | None:
    drift = drift_of(agent_id, utcnow(), threshold)
    return drift.reason if drift.alarm else None


def _listed_refusals(refused: list[ProposedChange]) -> list[dict[str, Any]]:
    """The refused changes as the prompt lists them: what was proposed, on which memories, and why not."""
    return [
        {
            "kind": change.kind,
            "ids": change.memory_ids,
            "was": [change.before(memory_id)["content"] for memory_id in change.memory_ids],
            "content": change.content,
            "why": change.stale_reason or f"rejected by a person on {change.proposal.decided_at:%Y-%m-%d}",
        }
        for change in refused
    ]


def _tool_loop(session: RefinementSession, prompt: str, max_turns: int) -> int:
    """Model turns of one pass with the refinement tool until it completes, the session is rolled back or the
    pass's turns run out; how many turns it took. A model error closes the session."""
    offered, target = {TOOL.name: TOOL}, targets.for_background(session.agent)
    try:
        transcript = run_tool_loop(
            target,
            [{"role": "user", "content": prompt}],
            purpose="refine",
            tools=schemas_for(offered.values()),
            run_call=lambda call, _transcript: run_tool_call(call, session, offered).result,
            max_turns=max_turns,
            agent_id=session.agent.id,
            finished=lambda: session.pass_over,
            # pages read earlier give way before the prompt outgrows its budget
            before_turn=lambda messages, tools: fit_to_budget(target, messages, tools),
        )
    except LLMError as error:
        db.session.rollback()
        session.close("memory_refinement_incomplete", reason=str(error))
        session.status = "incomplete"
        if session.mutations:  # a retry would start a fresh session with a fresh cap and a lower floor
            raise LLMError(
                f"{error} (not retried: the session had already changed memory)", retryable=False
            ) from error
        raise
    return len(transcript.turns)
