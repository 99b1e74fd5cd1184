"""A job's runs as job_runs records them: its kind (JobKind, by type in JOB_TYPES), the queued row that stands
for work to do, the row an execution takes on, and how it ends. The queue (webapp.jobs.queue) adds and runs them;
the sweep (webapp.jobs.sweep) closes those whose worker died."""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from rq import get_current_job

from webapp.extensions import db
from webapp.models import Agent, Chat, JobRun, Message
from webapp.timeutil import utcnow

NO_MODEL_SECONDS = 300  # a job that asks no model: the finders, ping


# job_type -> how to run it again (from its job_runs row), so the sweep and "Run again" can.
JOB_TYPES: dict[str, Callable[..., dict[str, Any]]] = {}


@dataclass(frozen=True)
class JobKind:
    """What the queue knows about one recorded job function."""

    job_type: str
    title: str  # what pages call it: "Refine core memory"
    target: Callable[..., str | None] | None
    of: type[Agent | Chat | Message] | None  # what the job's first argument is the id (or ids) of
    queue: str  # "replies" (served first) or "background"
    unique: str | None  # "queued": one queued run per target; "active": one queued or running; None
    resume: bool  # queue it again when its worker died
    on_interrupt: Callable[[JobRun, bool], None] | None  # (the dead run, whether it is queued again)
    timeout: Callable[..., int] | None  # seconds it may run, from its arguments; None: it asks no model

    def timeout_for(self, args: tuple[Any, ...] | list[Any]) -> int:
        """The job's time limit for these arguments (RQ's job timeout)."""
        return int(self.timeout(*args)) if self.timeout else NO_MODEL_SECONDS

    def target_of(self, args: tuple[Any, ...]) -> str | None:
        return self.target(*args) if self.target else None

    def lock_name(self, target: str | None) -> str:
        return f"run:{self.job_type}:{target or ''}"

    def account_of(self, args: tuple[Any, ...]) -> int | None:
        """The account whose data the run touches: that of the record its first argument names (for a list
        of ids, the first one), or None when the job has no such record or it is gone."""
        first = args[0] if args and self.of is not None else None
        if isinstance(first, list):
            first = first[0] if first else None
        if first is None:
            return None
        record = db.session.get(self.of, first)
        return record.account_id if record else None


def add_queued(kind: JobKind, args: list[Any], target: str | None, account_id: int | None) -> JobRun:
    run = JobRun(
        job_type=kind.job_type,
        account_id=account_id,
        target=target,
        args=args,
        rq_job_id=uuid.uuid4().hex,
        status="queued",
        started_at=utcnow(),
    )
    db.session.add(run)
    return run


def take_run(kind: JobKind, args: tuple[Any, ...]) -> JobRun | None:
    """The queued row this execution fulfils (or a new one); None when the sweep replaced this job."""
    rq_job = get_current_job()
    target = kind.target_of(args)
    if rq_job is not None:
        run = db.session.scalar(
            sa.select(JobRun).where(JobRun.rq_job_id == rq_job.id).order_by(JobRun.id.desc()).limit(1)
        )
        if run is not None and run.status == "interrupted":
            return None
    else:  # called inline (a CLI --now, a test): it does the work a queued run of the same target waits for
        run = db.session.scalar(
            sa.select(JobRun)
            .where(JobRun.job_type == kind.job_type, JobRun.target == target, JobRun.status == "queued")
            .order_by(JobRun.id)
            .limit(1)
        )
    if run is None or run.status != "queued":  # a scheduled job (rq-scheduler reuses its id), or inline
        run = add_queued(kind, list(args), target, kind.account_of(args))
        if rq_job is not None:
            run.rq_job_id = rq_job.id
    db.session.commit()
    return run


def queue_next_attempt(run_id: int) -> None:
    """RQ will run the job again after its backoff: a queued row says so, and survives a Redis loss."""
    failed = db.session.get(JobRun, run_id)
    kind = JOB_TYPES[failed.job_type].job_kind
    run = add_queued(kind, failed.args, failed.target, failed.account_id)
    run.rq_job_id = failed.rq_job_id
    db.session.commit()


def finish_run(run_id: int, status: str, *, error: str | None = None, counts: dict | None = None) -> None:
    values: dict[str, Any] = {"status": status, "finished_at": utcnow(), "error": error}
    if counts is not None:
        values["counts"] = counts
    db.session.execute(sa.update(JobRun).where(JobRun.id == run_id).values(**values))
    db.session.commit()
