"""What the admin pages share: their blueprint, the account's rows or a 404, pages of rows."""

from typing import Any

import sqlalchemy as sa
from flask import Blueprint, abort, flash, redirect, render_template, request
from flask.typing import ResponseReturnValue
from flask_login import current_user

from webapp.extensions import db
from webapp.models import Agent, AgentMemory, AuditLog

bp = Blueprint("admin", __name__, url_prefix="/admin")

PER_PAGE = 50
MAX_PAGE = 10_000  # deeper pages are not a reading use; the cap keeps OFFSET within range


def memory_or_404(memory_id: int) -> AgentMemory:
    """A memory of one of the signed-in user's agents; anything else is a 404."""
    memory = db.session.scalar(
        sa.select(AgentMemory)
        .join(Agent, Agent.id == AgentMemory.agent_id)
        .where(AgentMemory.id == memory_id, Agent.account_id == current_user.account_id)
    )
    if memory is None:
        abort(404)
    return memory


def account_audit() -> sa.Select:
    """Audit rows of the signed-in user's account."""
    return sa.select(AuditLog).where(AuditLog.account_id == current_user.account_id)


def page_number() -> int:
    return min(max(request.args.get("page", 1, type=int), 1), MAX_PAGE)


def page_of(query: sa.Select, page: int, per_page: int = PER_PAGE) -> tuple[list[Any], bool]:
    """One page of a query's rows (one SQL statement) and whether another page follows."""
    found = db.session.execute(query.offset((page - 1) * per_page).limit(per_page + 1)).all()
    rows = [row[0] if len(row) == 1 else row for row in found]
    return rows[:per_page], len(found) > per_page


VARY_HTMX = {"Vary": "HX-Request"}  # the headers of a URL that answers HTMX with a fragment of its page


def from_htmx() -> bool:
    """True when HTMX sent this form post, so a fragment answers it (the admin's one test of that)."""
    return bool(request.headers.get("HX-Request"))


def answer(
    fragment: str, status: int, fallback_url: str, flash_text: str | None, **context: Any
) -> ResponseReturnValue:
    """A fragment for HTMX; a plain form post is sent back to the page with a flash instead."""
    if from_htmx():
        return render_template(fragment, **context), status
    if flash_text:
        flash(flash_text)
    return redirect(fallback_url, code=303)
