"""An agent's memory ledger: its memories filtered and searched, its core budget, and edits made in place."""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from crontab import CronTab
from flask import render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from flask_wtf import FlaskForm
from redis.exceptions import RedisError
from sqlalchemy.orm import aliased
from wtforms import BooleanField, SelectField, TextAreaField
from wtforms.validators import DataRequired, Length

from webapp import search
from webapp.admin.common import answer, bp, from_htmx, memory_or_404, page_number, page_of
from webapp.admin.drift import drift_context
from webapp.admin.provenance import provenance
from webapp.admin.runs import KINDS
from webapp.extensions import db
from webapp.jobs import schedule
from webapp.models import Agent, AgentMemory
from webapp.models.audit import record_change
from webapp.models.memories import (
    AUDIENCES,
    MAX_CONTENT_CHARS,
    active_memories,
    core_token_usage,
    deleted_memories,
    like_pattern,
)
from webapp.search.terms import Match
from webapp.timeutil import utcnow
from webapp.web import health
from webapp.web.auth import admin_required, owned_or_404
from webapp.web.fragments import fragment_requested, page_or_fragment

log = logging.getLogger(__name__)

VIA = "admin"
REFINE_SCHEDULE = "cairn-refine"
FILTERS = {
    "active": "All active",
    "core": "Core",
    "journal": "Journal",
    "expired": "Expired journal",
    "constitutional": "Constitutional",
    "deleted": "Deleted",
}


class EditForm(FlaskForm):
    content = TextAreaField(
        "Memory",
        validators=[
            DataRequired(message="Write the memory first."),
            Length(max=MAX_CONTENT_CHARS, message=f"A memory has at most {MAX_CONTENT_CHARS:,} characters."),
        ],
        render_kw={"rows": 3},
    )
    memory_type = SelectField("Type", choices=["core", "journal"])


class AddForm(EditForm):
    constitutional = BooleanField("Constitutional (can never be deleted)")


@dataclass
class CoreTokens:
    """Active core tokens against the agent's budget, as the bar shows them."""

    usage: int
    budget: int

    @property
    def percent(self) -> int:
        return round(100 * self.usage / self.budget) if self.budget else 0

    @property
    def over(self) -> bool:
        return self.usage > self.budget


def _conditions(memory: Any, now: datetime) -> dict[str, list[sa.ColumnElement[bool]]]:
    """What each filter but "deleted" adds to the active scope, for the entity or alias `memory`."""
    return {
        "active": [],
        "core": [memory.memory_type == "core"],
        "journal": [memory.memory_type == "journal"],
        "expired": [memory.is_expired(now)],
        "constitutional": [memory.constitutional.is_(True)],
    }


def _listed(agent_id: int, show: str, q: str, now: datetime) -> sa.Select:
    """The agent's memories under one filter and an optional search, newest first."""
    if show == "deleted":
        query = deleted_memories(agent_id)
    else:
        query = active_memories(agent_id).where(*_conditions(AgentMemory, now)[show])
    if q:
        query = query.where(AgentMemory.content.ilike(like_pattern(q), escape="\\"))
        hits = search.ranked(AgentMemory, q, Match.ALL_PREFIXES, AgentMemory.agent_id == agent_id)
        if hits is not None:  # the full-text index finds the candidates; the pattern keeps what was typed
            query = query.where(AgentMemory.id.in_(sa.select(hits.c.id)))
    return query.order_by(AgentMemory.created_at.desc(), AgentMemory.id.desc())


def _counts(agent_id: int, now: datetime) -> dict[str, int]:
    """How many memories each filter shows (two queries, whatever the number of memories)."""
    active = aliased(AgentMemory, active_memories(agent_id).subquery())
    sums = [
        sa.func.coalesce(sa.func.sum(sa.case((sa.and_(sa.true(), *conditions), 1), else_=0)), 0).label(name)
        for name, conditions in _conditions(active, now).items()
    ]
    counts = dict(db.session.execute(sa.select(*sums)).one()._mapping)
    counts["deleted"] = db.session.scalar(deleted_memories(agent_id).with_only_columns(sa.func.count()))
    return counts


def _core_tokens(agent: Agent) -> CoreTokens:
    return CoreTokens(core_token_usage(agent.id), agent.core_token_budget)


def next_cron_run(cron: str, now: datetime) -> datetime:
    """The next time (naive UTC) a cron string fires after `now`."""
    timestamp = CronTab(cron).next(now=now, default_utc=True, delta=False)
    return datetime.fromtimestamp(timestamp, UTC).replace(tzinfo=None)


def _next_refinement() -> tuple[datetime, bool]:
    """When the weekly refinement runs next (UTC), and whether rq-scheduler actually holds that schedule."""
    try:
        for job_id, _cron, when in schedule.registered():
            if job_id == REFINE_SCHEDULE:
                return when, True
    except RedisError as error:  # the page still works while redis is down; say so in the log
        log.warning("Cannot read the schedules from redis: %s", error)
    cron = next(item.cron for item in schedule.SCHEDULES if item.id == REFINE_SCHEDULE)
    return next_cron_run(cron, utcnow()), False


def _ledger_context(agent: Agent) -> dict[str, Any]:
    """The filtered page of memories and the filter counts: what the ledger fragment shows."""
    show = request.args.get("show", "active")
    show = show if show in FILTERS else "active"
    q = request.args.get("q", "").strip()[:200]
    page, now = page_number(), utcnow()
    context = dict(agent=agent, show=show, q=q, page=page, now=now, filters=FILTERS)
    context["memories"], context["has_more"] = page_of(_listed(agent.id, show, q, now), page)
    context.update(provenance(context["memories"]))
    context["counts"] = _counts(agent.id, now)
    return context


def _full_context(agent: Agent, form: AddForm) -> dict[str, Any]:
    next_run, registered = _next_refinement()
    return (
        _ledger_context(agent)
        | {
            "tokens": _core_tokens(agent),
            "form": form,
            "next_run": next_run,
            "registered": registered,
            "kinds": KINDS,
            "search_mode": health.check_search().detail,
        }
        | drift_context(agent)
    )


@bp.get("/agents/<int:agent_id>/memories")
@admin_required
def ledger(agent_id: int) -> ResponseReturnValue:
    """An agent's memories (core and journal) with filters, search and pages; its core budget and runs."""
    agent = owned_or_404(Agent, agent_id)
    if fragment_requested("memory-ledger"):
        context = _ledger_context(agent)
    else:
        context = _full_context(agent, AddForm(formdata=None))
    return page_or_fragment("memories/ledger.html", {"memory-ledger": "memories/_ledger.html"}, **context)


@bp.post("/agents/<int:agent_id>/memories")
@admin_required
def create(agent_id: int) -> ResponseReturnValue:
    """Add a memory by hand."""
    agent = owned_or_404(Agent, agent_id)
    form = AddForm()
    if not form.validate():
        return _add_form_error(agent, form)
    memory = AgentMemory(
        agent=agent, content=form.content.data, memory_type=form.memory_type.data, audience="everyone"
    )
    memory.constitutional = form.constitutional.data
    db.session.add(memory)
    record_change(memory, "memory_create", None, via=VIA, user_id=current_user.id)
    db.session.commit()
    return _changed(memory, f"Memory #{memory.id} added.", add_form=AddForm(formdata=None))


def _add_form_error(agent: Agent, form: AddForm):
    """The add form again with its errors: in place for HTMX, else the whole page."""
    if not from_htmx():
        return render_template("memories/ledger.html", **_full_context(agent, form)), 422
    html = render_template("memories/_add_form.html", agent=agent, form=form)
    return html, 422, {"HX-Retarget": "#add-memory", "HX-Reswap": "outerHTML"}


@bp.get("/memories/<int:memory_id>")
@admin_required
def memory(memory_id: int) -> ResponseReturnValue:
    """One memory's row (what Cancel brings back)."""
    found = memory_or_404(memory_id)
    return render_template("memories/_memory.html", memory=found, now=utcnow(), **provenance([found]))


def _edit_form(memory: AgentMemory, **kwargs: Any) -> EditForm:
    return EditForm(prefix=f"memory-{memory.id}", obj=memory, **kwargs)


@bp.get("/memories/<int:memory_id>/edit")
@admin_required
def edit(memory_id: int) -> ResponseReturnValue:
    """A memory's row as a form, to edit it in place."""
    memory = memory_or_404(memory_id)
    if memory.is_deleted:
        return _refused(memory, "Restore this memory before editing it.")
    form = _edit_form(memory, formdata=None)
    return render_template("memories/_memory_edit.html", memory=memory, form=form)


@bp.post("/memories/<int:memory_id>")
@admin_required
def update(memory_id: int) -> ResponseReturnValue:
    """Save an edit of a memory's text or type."""
    memory = memory_or_404(memory_id)
    if memory.is_deleted:
        return _refused(memory, "Restore this memory before editing it.")
    form = _edit_form(memory)
    if not form.validate():
        return render_template("memories/_memory_edit.html", memory=memory, form=form), 422

    def apply() -> None:
        memory.content = form.content.data
        memory.memory_type = form.memory_type.data

    return _change(memory, "memory_update", apply, f"Memory #{memory.id} saved.")


@bp.post("/memories/<int:memory_id>/constitutional")
@admin_required
def toggle_constitutional(memory_id: int) -> ResponseReturnValue:
    """Make a memory constitutional (it can never be deleted), or ordinary again."""
    memory = memory_or_404(memory_id)
    if memory.is_deleted:
        return _refused(memory, "Restore this memory before changing its flags.")
    now = "ordinary" if memory.constitutional else "constitutional"

    def apply() -> None:
        memory.constitutional = not memory.constitutional

    return _change(memory, "memory_constitutional_toggle", apply, f"Memory #{memory.id} is now {now}.")


@bp.post("/memories/<int:memory_id>/audience")
@admin_required
def change_audience(memory_id: int) -> ResponseReturnValue:
    """Widen a memory to everyone of the account, or narrow it back to whoever may read the chat it came from."""
    memory = memory_or_404(memory_id)
    wanted = request.form.get("audience", "")
    if memory.is_deleted:
        return _refused(memory, "Restore this memory before changing who hears it.")
    if wanted not in AUDIENCES:
        return _refused(memory, "Choose who hears it: everyone, or its chat.")
    if wanted == "chat" and memory.chat_id is None:
        return _refused(memory, "This memory came from no chat: it can only be heard by everyone.")
    done = "heard by everyone" if wanted == "everyone" else "heard only where its chat may be read"

    def apply() -> None:
        memory.audience = wanted

    return _change(memory, "memory_audience", apply, f"Memory #{memory.id} is now {done}.")


@bp.post("/memories/<int:memory_id>/delete")
@admin_required
def delete(memory_id: int) -> ResponseReturnValue:
    """Soft-delete a memory (a constitutional one is refused)."""
    memory = memory_or_404(memory_id)
    if memory.is_deleted:
        return _changed(memory, f"Memory #{memory.id} was already deleted.")
    return _change(memory, "memory_delete", memory.soft_delete, f"Memory #{memory.id} deleted.")


@bp.post("/memories/<int:memory_id>/restore")
@admin_required
def restore(memory_id: int) -> ResponseReturnValue:
    """Bring a soft-deleted memory back."""
    memory = memory_or_404(memory_id)
    if not memory.is_deleted:
        return _changed(memory, f"Memory #{memory.id} is not deleted.")
    return _change(memory, "memory_restore", memory.restore, f"Memory #{memory.id} restored.")


def _change(memory: AgentMemory, action: str, apply: Callable[[], None], done: str):
    """Apply a change and record its audit row in the same transaction; the model's refusals are shown."""
    before = memory.snapshot()
    try:
        apply()
    except ValueError as error:  # ConstitutionalMemoryError, or content the model rejects
        db.session.rollback()
        return _refused(memory, str(error))
    if memory.snapshot() != before:
        record_change(memory, action, before, via=VIA, user_id=current_user.id)
    db.session.commit()
    return _changed(memory, done)


def _ledger_url(memory: AgentMemory) -> str:
    return url_for("admin.ledger", agent_id=memory.agent_id)


def _changed(memory: AgentMemory, done: str, **extra: Any):
    """The memory's new row, the token bar, tab counts and drift chart out of band; a plain form post goes back to
    the ledger."""
    now = utcnow()
    context = dict(memory=memory, now=now, tokens=_core_tokens(memory.agent), agent=memory.agent)
    context.update(provenance([memory]), counts=_counts(memory.agent_id, now))
    context.update(drift_context(memory.agent) if from_htmx() else {})
    return answer("memories/_changed.html", 200, _ledger_url(memory), done, **context, **extra)


def _refused(memory: AgentMemory, error: str):
    """The row again with the reason the change was refused."""
    context = dict(memory=memory, now=utcnow(), error=error, **provenance([memory]))
    return answer("memories/_memory.html", 422, _ledger_url(memory), error, **context)
