"""Recovering lost work: the sweep, run by every worker, one at a time, every SWEEP_SECONDS. A run whose worker
died (its lock no longer renewed) is closed as "interrupted" and queued again, and a queued run whose RQ job is
gone (Redis restarted or lost its data, queueing failed) is put back on RQ. The database is the record of work."""

import logging
import threading
from datetime import timedelta

import sqlalchemy as sa
from flask import Flask
from redis.exceptions import RedisError
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus

from webapp.extensions import db
from webapp.jobs.queue import HEARTBEAT_SECONDS, after_commit, lock_holder, once, push, redis_connection
from webapp.jobs.runs import JOB_TYPES, JobKind, add_queued
from webapp.models import JobRun
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)

SWEEP_SECONDS = 5  # how often some worker sweeps


QUEUED_GRACE = timedelta(seconds=5)  # a queued run younger than this may still be on its way to RQ


MAX_INTERRUPTIONS = 2  # a target whose runs died this often in a row is not queued again by the sweep


INTERRUPTED = "Interrupted: the worker running this job stopped before it finished."


LIVE_RQ_STATUSES = (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED, JobStatus.STARTED)


def sweep() -> dict[str, int]:
    """Close runs whose worker died (and queue them again), and put queued runs whose job is gone on RQ."""
    return {"interrupted": _close_dead_runs(), "requeued": _requeue_lost_jobs()}


def _close_dead_runs() -> int:
    closed = 0
    running = sa.select(JobRun).where(JobRun.status == "running").order_by(JobRun.id)
    for run in db.session.scalars(running).all():
        kind = JOB_TYPES[run.job_type].job_kind if run.job_type in JOB_TYPES else None
        name = kind.lock_name(run.target) if kind else None
        if name and lock_holder(name) == str(run.id):
            continue
        if _silent_for(run.id) < 2 * HEARTBEAT_SECONDS:
            continue  # just seen unlocked: a live holder re-takes its lock within a heartbeat (Redis restart)
        _interrupt(run, kind)
        closed += 1
    return closed


def _silent_for(run_id: int) -> float:
    """Seconds since the sweep first saw this run's lock missing (0 the first time)."""
    key, ttl = f"cairn:once:unlocked:{run_id}", 300
    if once(f"unlocked:{run_id}", ttl):
        return 0.0
    return ttl - redis_connection().pttl(key) / 1000


def _interrupt(run: JobRun, kind: JobKind | None) -> None:
    run.status, run.finished_at, run.error = "interrupted", utcnow(), INTERRUPTED
    _forget_rq_job(run.rq_job_id)
    again = kind is not None and kind.resume and _interruptions(run) < MAX_INTERRUPTIONS
    if kind and kind.on_interrupt:
        kind.on_interrupt(run, again)
    if again:
        queued = add_queued(kind, run.args, run.target, run.account_id)
        after_commit(queued.rq_job_id, JOB_TYPES[run.job_type], run.args)
    else:
        run.error = f"{INTERRUPTED} Not queued again."
    db.session.commit()
    log.warning("run %s (%s %s) was interrupted; queued again: %s", run.id, run.job_type, run.target, again)


def _interruptions(run: JobRun) -> int:
    """How many of the target's latest runs in a row were interrupted (this one included)."""
    latest = db.session.scalars(
        sa.select(JobRun.status)
        .where(JobRun.job_type == run.job_type, JobRun.target == run.target, JobRun.status != "queued")
        .order_by(JobRun.id.desc())
        .limit(MAX_INTERRUPTIONS + 1)
    ).all()
    count = 0
    for status in latest:
        if status != "interrupted" and count:
            break
        count += status == "interrupted"
    return count


def _forget_rq_job(job_id: str | None) -> None:
    """Drop a dead run's RQ job, so RQ's own abandoned-job handling does not start it a second time."""
    job = _rq_job(job_id)
    if job is not None:
        job.delete()


def _rq_job(job_id: str | None) -> Job | None:
    if not job_id:
        return None
    try:
        return Job.fetch(job_id, connection=redis_connection())
    except NoSuchJobError:
        return None


def _requeue_lost_jobs() -> int:
    requeued = 0
    waiting = sa.select(JobRun).where(JobRun.status == "queued", JobRun.started_at < utcnow() - QUEUED_GRACE)
    runs = db.session.scalars(waiting.order_by(JobRun.id)).all()
    jobs = Job.fetch_many([run.rq_job_id for run in runs], connection=redis_connection()) if runs else []
    for run, job in zip(runs, jobs, strict=True):
        status = job.get_status(refresh=False) if job is not None else None
        if status in LIVE_RQ_STATUSES:
            continue
        if status in (JobStatus.FINISHED, JobStatus.FAILED):  # it ran without ever taking this row
            said = getattr(status, "value", status)
            run.status, run.finished_at = "failed", utcnow()
            run.error = f"The queue dropped this job (RQ says {said}) before it ran."
            db.session.commit()
        elif run.job_type in JOB_TYPES:
            push(run.rq_job_id, JOB_TYPES[run.job_type], run.args)
            requeued += 1
    return requeued


def sweep_forever(app: Flask, stop: threading.Event) -> None:
    """Run by every worker in a thread: every SWEEP_SECONDS, one of them sweeps (whichever asks first)."""
    while not stop.wait(SWEEP_SECONDS):
        with app.app_context():
            try:
                if once("sweep", SWEEP_SECONDS - 0.5):
                    found = sweep()
                    if any(found.values()):
                        log.info("sweep: %s", found)
            except (RedisError, sa.exc.SQLAlchemyError) as error:
                log.warning("sweep skipped: %s", error)
            finally:
                db.session.remove()
