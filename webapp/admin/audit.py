"""The audit log: every change to every memory of the account, filterable, each memory change undoable."""

from datetime import date, datetime, time, timedelta

import sqlalchemy as sa
from flask import abort, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user

from webapp.admin.common import answer, bp, page_number, page_of
from webapp.admin.entries import LABELS, Entry, build_entries, entry_query
from webapp.extensions import db
from webapp.models import Agent, AuditLog
from webapp.models.audit import undo
from webapp.web.auth import admin_required
from webapp.web.fragments import fragment_requested, page_or_fragment

FILTER_KEYS = ("agent", "action", "session", "since", "until")


def _day(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def _filters() -> dict[str, str]:
    """The valid filters in the query string: agent id, action, session id, first and last day (UTC)."""
    raw = {key: request.args.get(key, "").strip() for key in FILTER_KEYS}
    valid = {
        "agent": raw["agent"].isdecimal() and raw["agent"].isascii() and len(raw["agent"]) < 10,
        "action": raw["action"] in LABELS,
        "session": 0 < len(raw["session"]) <= 36,
        "since": _day(raw["since"]) is not None,
        "until": _day(raw["until"]) is not None,
    }
    return {key: value for key, value in raw.items() if valid[key]}


def _filtered(filters: dict[str, str]) -> sa.Select:
    query = entry_query()
    if "agent" in filters:
        query = query.where(AuditLog.agent_id == int(filters["agent"]))
    if "action" in filters:
        query = query.where(AuditLog.action == filters["action"])
    if "session" in filters:
        query = query.where(AuditLog.session_id == filters["session"])
    if "since" in filters:
        query = query.where(AuditLog.created_at >= datetime.combine(_day(filters["since"]), time.min))
    if "until" in filters:
        end = datetime.combine(_day(filters["until"]) + timedelta(days=1), time.min)
        query = query.where(AuditLog.created_at < end)
    return query.order_by(AuditLog.created_at.desc(), AuditLog.id.desc())


def _account_agents() -> list[Agent]:
    return list(
        db.session.scalars(
            sa.select(Agent).where(Agent.account_id == current_user.account_id).order_by(Agent.name)
        )
    )


@bp.get("/audit")
@admin_required
def audit() -> ResponseReturnValue:
    """Every change to the account's memories, newest first, by whom, with before and after as a diff."""
    filters, page = _filters(), page_number()
    results, has_more = page_of(_filtered(filters), page)
    context = dict(entries=build_entries(results), filters=filters, page=page, has_more=has_more)
    if not fragment_requested("audit-log"):
        context.update(agents=_account_agents(), actions=LABELS)
    return page_or_fragment("memories/audit.html", {"audit-log": "memories/_audit.html"}, **context)


def entry_or_404(row_id: int) -> Entry:
    """The audit row with this id in the signed-in user's account, as an entry; else a 404."""
    result = db.session.execute(entry_query().where(AuditLog.id == row_id)).first()
    if result is None:
        abort(404)
    return Entry(*result)


@bp.post("/audit/<int:row_id>/undo")
@admin_required
def undo_change(row_id: int) -> ResponseReturnValue:
    """Put a memory back as it was before this change; the undo is recorded as a change of its own."""
    entry = entry_or_404(row_id)
    fallback = request.referrer or url_for("admin.audit")
    try:
        undone = undo(entry.row, user_id=current_user.id, via="admin")
    except ValueError as error:  # UndoConflict, or the memory refusing the old state
        db.session.rollback()
        entry.error = str(error)
        return answer("memories/_entry.html", 422, fallback, entry.error, entry=entry)
    db.session.commit()
    entry.undone_by, entry.done = undone.id, f"Undone (change #{undone.id})."
    return answer("memories/_entry.html", 200, fallback, entry.done, entry=entry)
