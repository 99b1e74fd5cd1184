"""The cost ledger for admins: tokens and dollars by day, agent, purpose and model; recent job runs."""

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from math import floor, log10
from typing import Any

import sqlalchemy as sa
from flask import abort, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

import webapp.jobs
from webapp.admin.common import answer, bp, page_number, page_of
from webapp.admin.prices import RUNS_HERE, Price, price_of
from webapp.admin.run_words import on_unreadable_chats, worked_on
from webapp.extensions import db
from webapp.jobs.queue import enqueue
from webapp.jobs.runs import JOB_TYPES
from webapp.llm import targets
from webapp.models import Agent, JobRun, LlmCall
from webapp.models.connections import account_connections
from webapp.models.runs import JOB_RUN_STATUSES
from webapp.timeutil import utcnow
from webapp.web.auth import admin_required
from webapp.web.fragments import fragment_requested, page_or_fragment

WINDOWS = (7, 30, 90)  # days the usage page can show
DEFAULT_WINDOW = 30
RUNS_PER_PAGE = 50
CHART = {"width": 960, "height": 260, "left": 56, "right": 10, "top": 12, "bottom": 26}

webapp.jobs.load_all()  # the web process must know every job type to re-run one


class CalendarDay(FunctionElement):
    """The calendar day of a naive UTC datetime column, as a date, on PostgreSQL and SQLite alike."""

    type = sa.Date()
    name = "calendar_day"
    inherit_cache = True


@compiles(CalendarDay)
def _calendar_day(element, compiler, **kw) -> str:
    return f"CAST({compiler.process(element.clauses, **kw)} AS DATE)"


@compiles(CalendarDay, "sqlite")
def _calendar_day_sqlite(element, compiler, **kw) -> str:
    # SQLite casts '2025-05-01 12:00:00' AS DATE to the number 2025; date() keeps the day.
    return f"date({compiler.process(element.clauses, **kw)})"


@dataclass
class Usage:
    """Tokens, calls and dollars of a group of LLM calls; calls to a model with no price known add none."""

    input_tokens: int = 0
    output_tokens: int = 0
    calls: int = 0
    errors: int = 0
    cost: float = 0.0
    unpriced_calls: int = 0
    sources: set[str] = field(default_factory=set)  # where the prices came from (webapp.admin.prices)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def priced(self) -> bool:
        """True when at least some of these calls have a price (else the cost shows as "no price known")."""
        return self.unpriced_calls < self.calls

    @property
    def runs_here(self) -> bool:
        """True when every priced call went to a model on this machine (the cost reads "$0 (runs here)")."""
        return self.sources == {RUNS_HERE}

    def add(self, row: sa.Row, price: Price | None) -> None:
        """Add one grouped row of the ledger (per model) at its model's price."""
        self.input_tokens += row.input_tokens or 0
        self.output_tokens += row.output_tokens or 0
        self.calls += row.calls
        self.errors += row.errors or 0
        if price is None:
            self.unpriced_calls += row.calls
            return
        self.sources.add(price.source)
        self.cost += price.dollars(row.input_tokens or 0, row.output_tokens or 0)


def _account_agent_ids() -> sa.Select:
    return sa.select(Agent.id).where(Agent.account_id == current_user.account_id)


def _grouped(keys: Iterable[Any], *conditions: Any) -> list[sa.Row]:
    """Sums per key and model over the LLM calls of this account's agents (calls without an agent belong to none)."""
    query = (
        sa.select(
            *keys,
            LlmCall.model,
            LlmCall.connection_id,
            sa.func.sum(LlmCall.prompt_tokens).label("input_tokens"),
            sa.func.sum(LlmCall.completion_tokens).label("output_tokens"),
            sa.func.count().label("calls"),
            sa.func.sum(sa.case((LlmCall.status == "error", 1), else_=0)).label("errors"),
        )
        # IN rather than a join: SQLite would otherwise walk every call of every agent to find a few runs' calls.
        .where(LlmCall.agent_id.in_(_account_agent_ids()), *conditions)
        .group_by(*keys, LlmCall.model, LlmCall.connection_id)
    )
    return db.session.execute(query).all()


def _fold(rows: Iterable[sa.Row], key: Callable[[sa.Row], Any], pricing: "Pricing") -> dict[Any, Usage]:
    """Per-model rows summed by key, with dollars for the models whose price is known at the connection that
    answered each call."""
    folded: dict[Any, Usage] = defaultdict(Usage)
    for row in rows:
        url, overrides = pricing.get(
            row.connection_id, pricing[None]
        )  # a removed connection: the environment's
        folded[key(row)].add(row, price_of(row.model, provider_url=url, overrides=overrides))
    return dict(folded)


Pricing = dict[int | None, tuple[str, dict[str, dict[str, float]]]]


def _pricing(rows: list[sa.Row]) -> Pricing:
    """The address and the prices an admin set of each connection these rows' calls went to, by its id (None:
    the environment's, whose calls are every call made before connections too); one query, when any went to a
    connection an admin added."""
    pricing: Pricing = {None: (targets.environment_connection().base_url, {})}
    if all(row.connection_id is None for row in rows):
        return pricing
    for row in account_connections(current_user.account_id):
        prices = {
            model: s for model, s in (row.model_settings or {}).items() if "input" in s or "output" in s
        }
        pricing[row.id] = (row.base_url, prices)
    return pricing


def _largest_first(usage: dict[Any, Usage]) -> list[tuple[Any, Usage]]:
    return sorted(usage.items(), key=lambda item: (-item[1].tokens, str(item[0])))


def _report(days: int) -> dict[str, Any]:
    """Everything the usage page shows for the last `days` days (today included), in four queries."""
    first = utcnow().date() - timedelta(days=days - 1)
    since = LlmCall.created_at >= datetime.combine(first, time.min)
    day_rows = _grouped([CalendarDay(LlmCall.created_at).label("day")], since)
    agent_rows = _grouped([LlmCall.agent_id], since)
    pricing = _pricing(agent_rows)  # the same calls as by day
    by_day = _fold(day_rows, lambda r: r.day, pricing)
    purpose_rows = _grouped([LlmCall.purpose], since)
    names = dict(db.session.execute(_account_agent_ids().add_columns(Agent.name)).all())
    return {
        "days": days,
        "first": first,
        "by_day": sorted(by_day.items()),
        "by_agent": _largest_first(_fold(agent_rows, lambda r: names[r.agent_id], pricing)),
        "by_purpose": _largest_first(_fold(purpose_rows, lambda r: r.purpose, pricing)),
        "by_model": _largest_first(_fold(agent_rows, lambda r: r.model, pricing)),
        "total": _fold(agent_rows, lambda r: "total", pricing).get("total", Usage()),
        "chart": _chart(first, days, by_day),
    }


def _nice_ceiling(value: int) -> int:
    """The smallest round number (1, 2, 4, 6 or 8 × 10ⁿ) at or above value, so four gridlines read well."""
    if value <= 4:
        return 4
    magnitude = 10 ** floor(log10(value))
    return next(step * magnitude for step in (1, 2, 4, 6, 8, 10) if step * magnitude >= value)


def _compact(tokens: float) -> str:
    """12k, 1.5M: numbers short enough for an axis."""
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if tokens >= limit:
            return f"{tokens / limit:.3g}{suffix}"
    return f"{tokens:.3g}"


def _chart(first: date, days: int, by_day: dict[date, Usage]) -> dict[str, Any]:
    """Geometry of the chart: per day with calls, input tokens stacked under output tokens; axis ticks."""
    plot_width = CHART["width"] - CHART["left"] - CHART["right"]
    plot_height = CHART["height"] - CHART["top"] - CHART["bottom"]
    baseline = CHART["top"] + plot_height
    top = _nice_ceiling(max((u.tokens for u in by_day.values()), default=0))
    slot = plot_width / days

    def y(tokens: int) -> float:
        return round(baseline - plot_height * tokens / top, 1)

    def x(day: date, offset: float = 0.5) -> float:
        return round(CHART["left"] + slot * ((day - first).days + offset), 1)

    def bar(day: date, usage: Usage) -> dict[str, Any]:
        input_y, output_y = y(usage.input_tokens), y(usage.tokens)
        heights = {
            "input_height": round(baseline - input_y, 1),
            "output_height": round(input_y - output_y, 1),
        }
        return {
            "day": day,
            "usage": usage,
            "x": x(day, 0.15),
            "input_y": input_y,
            "output_y": output_y,
            **heights,
        }

    bars = [bar(day, usage) for day, usage in sorted(by_day.items())]
    step = max(1, days // 6)
    labels = [(x(first + timedelta(days=i)), first + timedelta(days=i)) for i in range(0, days, step)]
    ticks = [(y(top * i // 4), _compact(top * i / 4)) for i in range(5)]
    geometry = {"baseline": baseline, "plot_height": plot_height, "bar_width": round(slot * 0.7, 1)}
    return {**CHART, **geometry, "bars": bars, "labels": labels, "ticks": ticks}


@bp.app_template_filter("usd")
def _usd(dollars: float) -> str:
    """Dollars with cents, or with four decimals for the fractions of a cent small models cost."""
    if 0 < dollars < 0.0001:
        return "<$0.0001"
    return f"${dollars:,.2f}" if dollars >= 1 or dollars == 0 else f"${dollars:.4f}"


@bp.app_template_filter("run_duration")
def _run_duration(seconds: float | None) -> str:
    """1.2 s, 4 min 05 s, 2 h 03 min."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


@bp.get("/usage")
@admin_required
def index() -> ResponseReturnValue:
    """Tokens in and out (and dollars, for models with a price) by day, agent, purpose and model."""
    days = request.args.get("days", DEFAULT_WINDOW, type=int)
    report = _report(days if days in WINDOWS else DEFAULT_WINDOW)
    return page_or_fragment("usage/index.html", {"usage": "usage/_report.html"}, windows=WINDOWS, **report)


def _visible_runs() -> sa.Select:
    """Runs of this account only: a run with no account (the schedulers' finders, ping) belongs to no tenant."""
    return sa.select(JobRun).where(JobRun.account_id == current_user.account_id)


def _job_filters() -> dict[str, str]:
    """The valid filters in the query string: job type, status and the day a run started (YYYY-MM-DD)."""
    filters = {key: request.args.get(key, "").strip() for key in ("type", "status", "day")}
    if filters["status"] not in JOB_RUN_STATUSES:
        filters["status"] = ""
    if request.args.get("day", type=date.fromisoformat) is None:
        filters["day"] = ""
    return {key: value for key, value in filters.items() if value}


def _filtered_runs(filters: dict[str, str]) -> sa.Select:
    query = _visible_runs()
    if "type" in filters:
        query = query.where(JobRun.job_type == filters["type"])
    if "status" in filters:
        query = query.where(JobRun.status == filters["status"])
    if "day" in filters:
        start = datetime.combine(date.fromisoformat(filters["day"]), time.min)
        query = query.where(JobRun.started_at >= start, JobRun.started_at < start + timedelta(days=1))
    return query.order_by(JobRun.started_at.desc(), JobRun.id.desc())


def _job_types() -> list[str]:
    """Job types to filter by: those that ran here, and those this app can run."""
    ran = db.session.scalars(_visible_runs().with_only_columns(JobRun.job_type).distinct())
    return sorted(set(ran) | set(JOB_TYPES))


@bp.get("/jobs")
@admin_required
def jobs() -> ResponseReturnValue:
    """Recent background job runs with status, duration, tokens and errors; filterable, newest first."""
    filters = _job_filters()
    page = page_number()
    runs, has_more = page_of(_filtered_runs(filters), page, RUNS_PER_PAGE)
    ids = [run.id for run in runs]
    rows = _grouped([LlmCall.job_run_id], LlmCall.job_run_id.in_(ids))
    usage = _fold(rows, lambda r: r.job_run_id, _pricing(rows))
    context = dict(runs=runs, usage=usage, filters=filters, page=page, has_more=has_more)
    context["worked_on"] = worked_on(runs)
    context["withheld"] = on_unreadable_chats(context["worked_on"])
    context["job_functions"] = JOB_TYPES
    if not fragment_requested("job-runs"):
        context.update(job_types=_job_types(), statuses=JOB_RUN_STATUSES)
    return page_or_fragment("usage/jobs.html", {"job-runs": "usage/_runs.html"}, **context)


@bp.post("/jobs/<int:run_id>/rerun")
@admin_required
def rerun(run_id: int) -> ResponseReturnValue:
    """Enqueue a failed run's job again with the same arguments; it is recorded as a new run."""
    run = db.session.scalar(_visible_runs().where(JobRun.id == run_id))
    if run is None:
        abort(404)
    func = JOB_TYPES.get(run.job_type)
    if run.status not in ("failed", "interrupted"):
        message = f"Run {run.id} is {run.status}; only a failed or interrupted run can be run again."
        return _rerun_answer(run, message, 422)
    if func is None:
        return _rerun_answer(run, f"This app has no job of type “{run.job_type}” to run.", 422)
    enqueue(func, *(run.args or []))
    db.session.commit()
    return _rerun_answer(run, "Queued again. The new attempt will appear as a new run.", 200)


def _rerun_answer(run: JobRun, text: str, status: int) -> ResponseReturnValue:
    return answer(
        "usage/_rerun.html", status, url_for("admin.jobs"), text, run=run, text=text, ok=status == 200
    )
