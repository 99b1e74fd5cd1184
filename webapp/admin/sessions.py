"""Refinement sessions: a list per agent, a page per session with its operations, and rolling one back."""

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from flask import abort, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user

from webapp.admin.common import account_audit, answer, bp, page_number, page_of
from webapp.admin.entries import Entry, build_entries, entry_query
from webapp.admin.runs import CLOSING
from webapp.extensions import db
from webapp.models import Agent, AuditLog, User
from webapp.models.audit import ROLLED_BACK, UndoConflict, roll_back_session
from webapp.timeutil import utcnow
from webapp.web.auth import admin_required, owned_or_404
from webapp.web.fragments import page_or_fragment

START = "memory_refinement_start"
UNFINISHED_AFTER = timedelta(hours=1)  # a session this old without a closing row lost its worker
SESSIONS_PER_PAGE = 25


@dataclass
class Session:
    """One refinement session as its session-level audit rows on the agent describe it."""

    id: str
    start: AuditLog | None
    closings: list[tuple[AuditLog, str | None]] = field(default_factory=list)  # (row, acting user's email)

    @property
    def started_at(self) -> datetime | None:
        return self.start.created_at if self.start else None

    @property
    def closing(self) -> AuditLog | None:
        """The row the session itself closed with: complete, incomplete, or the circuit breaker's rollback."""
        own = [row for row, email in self.closings if row.user_id is None]
        return own[0] if own else None

    @property
    def rollback(self) -> tuple[AuditLog, str | None] | None:
        return next(((row, email) for row, email in self.closings if row.action == ROLLED_BACK), None)

    @property
    def status(self) -> str:
        if self.rollback:
            return "rolled back"
        if self.closing:
            return self.closing.action.removeprefix("memory_refinement_")
        if self.start is None:  # refine_agent deduplicated, then found nothing to refine
            return "dedup only"
        if self.started_at and self.started_at < utcnow() - UNFINISHED_AFTER:
            return "unfinished"
        return "running"

    @property
    def rolled_back_by(self) -> str | None:
        if not self.rollback:
            return None
        row, email = self.rollback
        return email or "the circuit breaker"

    def data(self, key: str) -> Any:
        """A figure from the closing row, else from the start row."""
        for row in (self.closing, self.start):
            if row is not None and key in row.data:
                return row.data[key]
        return None

    def refusal(self) -> str | None:
        """Why this session cannot be rolled back now, or None."""
        if self.rollback:
            row, _email = self.rollback
            when = row.created_at.strftime("%Y-%m-%d %H:%M")
            return f"This session was already rolled back by {self.rolled_back_by} on {when} UTC."
        if self.status == "running":
            return "This session is still running; roll it back once it has finished."
        return None


def _closings(session_ids: list[str]) -> dict[str, list[tuple[AuditLog, str | None]]]:
    found: dict[str, list[tuple[AuditLog, str | None]]] = {sid: [] for sid in session_ids}
    rows = db.session.execute(
        sa.select(AuditLog, User.email)
        .outerjoin(User, User.id == AuditLog.user_id)
        .where(AuditLog.account_id == current_user.account_id, AuditLog.session_id.in_(session_ids))
        .where(AuditLog.auditable_type == "Agent", AuditLog.action.in_(CLOSING))
        .order_by(AuditLog.id)
    )
    for row, email in rows:
        found[row.session_id].append((row, email))
    return found


@bp.get("/agents/<int:agent_id>/sessions")
@admin_required
def sessions(agent_id: int) -> ResponseReturnValue:
    """The agent's refinement sessions, newest first: date, status, stats and core tokens before and after."""
    agent = owned_or_404(Agent, agent_id)
    page = page_number()
    starts, has_more = page_of(
        account_audit()
        .where(AuditLog.agent_id == agent.id, AuditLog.action == START)
        .order_by(AuditLog.id.desc()),
        page,
        SESSIONS_PER_PAGE,
    )
    closings = _closings([row.session_id for row in starts])
    found = [Session(row.session_id, row, closings[row.session_id]) for row in starts]
    context = dict(agent=agent, sessions=found, page=page, has_more=has_more)
    return page_or_fragment("memories/sessions.html", {"session-list": "memories/_sessions.html"}, **context)


def _session_or_404(session_id: str) -> tuple[Session, list[Entry]]:
    """The session's summary and every audit row it wrote, oldest first (404 outside the account)."""
    results = db.session.execute(
        entry_query().where(AuditLog.session_id == session_id).order_by(AuditLog.id)
    ).all()
    if not results:
        abort(404)
    entries = build_entries(results)
    rows = [(e.row, e.email) for e in entries]
    start = next((row for row, _email in rows if row.action == START), None)
    closings = [
        (row, email) for row, email in rows if row.auditable_type == "Agent" and row.action in CLOSING
    ]
    return Session(session_id, start, closings), entries


def _session_context(session_id: str) -> dict[str, Any]:
    session, entries = _session_or_404(session_id)
    agent = db.session.get(Agent, entries[0].row.agent_id)
    return dict(session=session, entries=entries, agent=agent)


@bp.get("/sessions/<session_id>")
@admin_required
def session(session_id: str) -> ResponseReturnValue:
    """One refinement session: its figures and every operation it made, with "Roll back this session"."""
    context = _session_context(session_id)
    return page_or_fragment("memories/session.html", {"session": "memories/_session.html"}, **context)


@bp.post("/sessions/<session_id>/rollback")
@admin_required
def rollback(session_id: str) -> ResponseReturnValue:
    """Undo every memory change of the session, newest first, once; recorded as changes of their own."""
    context = _session_context(session_id)
    url = url_for("admin.session", session_id=session_id)
    refusal = context["session"].refusal()
    if refusal:
        return answer("memories/_session.html", 422, url, refusal, **context, error=refusal)
    try:
        row = roll_back_session(context["agent"], session_id, user_id=current_user.id, via="admin")
    except UndoConflict as conflict:
        db.session.rollback()
        return answer("memories/_session.html", 422, url, str(conflict), **context, error=str(conflict))
    db.session.commit()
    restored = row.data["restored"]
    done = f"Rolled back: {restored} change{'' if restored == 1 else 's'} undone."
    return answer("memories/_session.html", 200, url, done, **_session_context(session_id), done=done)
