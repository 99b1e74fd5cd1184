"""Run now: refinement, reflection or consolidation of one agent, its status followed live from job_runs.

A click enqueues through webapp.jobs.queue (after commit, like every job) and notes the account's newest job_runs
id. A run of this kind for this agent's target with a higher id is the one the click started: "queued" until
its row appears, then its status. Ids, not clocks, so a worker on a host with a skewed clock cannot confuse it,
and webapp.jobs.queue needs no RQ job ids.
"""

from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from flask import abort, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user

from webapp.admin.common import account_audit, answer, bp
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.queue import enqueue, job_target, target_ids, waiting_run
from webapp.jobs.refinement import CLOSING, refine_agent
from webapp.jobs.reflection import reflect_agent
from webapp.models import Agent, AuditLog, Chat, ChatAgent, JobRun
from webapp.web.auth import admin_required, owned_or_404

# What each button does, in the words it shows (the keys are job types).
KINDS = {
    "refine": "Refine core memory now",
    "reflect": "Reflect on the journal now",
    "consolidate": "Extract memories from group chats now",
}


@dataclass
class Progress:
    """Where the runs a click started stand: queued, running, done or failed (or refused, with a message)."""

    kind: str
    after: int
    targets: list[str]
    runs: list[JobRun] = field(default_factory=list)  # the latest run of each target found so far
    closing: AuditLog | None = None  # refinement: the session's closing audit row
    message: str | None = None

    @property
    def state(self) -> str:
        if self.message:
            return "refused"
        if any(r.status == "running" for r in self.runs):
            return "running"
        if len(self.runs) < len(self.targets) or any(r.status == "queued" for r in self.runs):
            return "queued"
        return "failed" if any(r.status in ("failed", "interrupted") for r in self.runs) else "done"

    @property
    def polling(self) -> bool:
        return self.state in ("queued", "running")

    @property
    def totals(self) -> dict[str, int]:
        """The numeric counts of the finished runs, added up."""
        totals: dict[str, int] = {}
        for run in self.runs:
            for key, value in (run.counts or {}).items():
                if isinstance(value, int) and not isinstance(value, bool):
                    totals[key] = totals.get(key, 0) + value
        return totals

    @property
    def skipped(self) -> list[str]:
        return [
            str(r.counts["skipped"]) for r in self.runs if isinstance((r.counts or {}).get("skipped"), str)
        ]


def _group_chat_ids(agent: Agent) -> list[int]:
    """The agent's group chats that are not discarded: what consolidating this agent means."""
    return list(
        db.session.scalars(
            sa.select(Chat.id)
            .join(ChatAgent, ChatAgent.chat_id == Chat.id)
            .where(ChatAgent.agent_id == agent.id, Chat.account_id == agent.account_id)
            .where(Chat.manual_responses.is_(True), Chat.discarded_at.is_(None))
            .order_by(Chat.id)
        )
    )


def _targets(kind: str, agent: Agent) -> list[str]:
    if kind == "consolidate":
        return [job_target(chat=chat_id) for chat_id in _group_chat_ids(agent)]
    return [job_target(agent=agent.id)]


def _enqueue(kind: str, agent: Agent, targets: list[str]) -> int | None:
    """Queue the runs; the id of the oldest run already waiting for one of the targets, if any."""
    if kind == "refine":
        calls = [(refine_agent, agent.id, True)]
    elif kind == "reflect":
        calls = [(reflect_agent, agent.id)]
    else:
        calls = [
            (consolidate_chat, chat_id, True) for target in targets for chat_id in target_ids(target, "chat")
        ]
    waiting = [waiting_run(*call) for call in calls]
    for call in calls:
        enqueue(*call)
    return min((run.id for run in waiting if run is not None), default=None)


def _progress(kind: str, agent: Agent, after: int) -> Progress:
    """The latest run of each target started after job_runs id `after` (two queries at most)."""
    progress = Progress(kind, after, _targets(kind, agent))
    runs = db.session.scalars(
        sa.select(JobRun)
        .where(JobRun.account_id == current_user.account_id, JobRun.job_type == kind, JobRun.id > after)
        .where(JobRun.target.in_(progress.targets))
        .order_by(JobRun.id)
    )
    progress.runs = list({run.target: run for run in runs}.values())
    session_id = next((r.counts.get("session_id") for r in progress.runs if r.counts), None)
    if kind == "refine" and session_id and not progress.polling:
        progress.closing = db.session.scalar(
            account_audit()
            .where(AuditLog.session_id == session_id, AuditLog.action.in_(CLOSING))
            .order_by(AuditLog.id.desc())
            .limit(1)
        )
    return progress


def _kind_or_404(kind: str) -> str:
    if kind not in KINDS:
        abort(404)
    return kind


@bp.post("/agents/<int:agent_id>/run/<kind>")
@admin_required
def run_now(agent_id: int, kind: str) -> ResponseReturnValue:
    """Enqueue refinement (forced), reflection, or consolidation of the agent's group chats, now."""
    agent, kind = owned_or_404(Agent, agent_id), _kind_or_404(kind)
    newest = sa.func.coalesce(sa.func.max(JobRun.id), 0)
    after = db.session.scalar(sa.select(newest).where(JobRun.account_id == current_user.account_id))
    progress = Progress(kind, after, _targets(kind, agent))
    if agent.paused:
        progress.message = f"{agent.name} is paused; unpause the agent to run its memory jobs."
    elif not progress.targets:
        progress.message = f"{agent.name} is in no group chat to extract memories from."
    else:
        waiting_since = _enqueue(kind, agent, progress.targets)
        if waiting_since is not None:  # the click follows the run already waiting for that target
            progress.after = min(progress.after, waiting_since - 1)
        db.session.commit()
    flash_text = progress.message or f"Queued: {KINDS[kind].removesuffix(' now').lower()}."
    url = url_for("admin.ledger", agent_id=agent.id)
    return answer(
        "memories/_run.html", 422 if progress.message else 200, url, flash_text, **_view(agent, progress)
    )


@bp.get("/agents/<int:agent_id>/run/<kind>")
@admin_required
def run_status(agent_id: int, kind: str) -> ResponseReturnValue:
    """The live status of the runs a click started (the page polls it every 2 s until they finish)."""
    agent, kind = owned_or_404(Agent, agent_id), _kind_or_404(kind)
    progress = _progress(kind, agent, request.args.get("after", 0, type=int))
    return render_template("memories/_run.html", **_view(agent, progress))


def _view(agent: Agent, progress: Progress) -> dict[str, Any]:
    return {"agent": agent, "progress": progress, "kind": progress.kind}
