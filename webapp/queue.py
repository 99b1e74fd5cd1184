"""Background jobs: the one way to enqueue (after commit) and the one way to record a run."""

import functools
import logging
import traceback
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from flask import Flask, current_app
from flask_sqlalchemy.session import Session as FlaskSession
from redis import Redis
from rq import Queue, Retry, get_current_job

from webapp.extensions import db
from webapp.llm import LLMError
from webapp.models import JobRun
from webapp.models.runs import current_job_run_id
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)

RETRY_INTERVALS = [10, 60, 300]  # seconds: backoff for retryable failures
_PENDING = "cairn_pending_jobs"

# job_type -> the recorded job function, so a failed run can be run again from its job_runs row.
JOB_TYPES: dict[str, Callable[..., dict[str, Any]]] = {}


def init_app(app: Flask) -> None:
    connection = Redis.from_url(app.config["REDIS_URL"], socket_connect_timeout=5, health_check_interval=30)
    app.extensions["redis"] = connection
    app.extensions["rq_queue"] = Queue(app.config["RQ_QUEUE"], connection=connection)


def redis_connection() -> Redis:
    return current_app.extensions["redis"]


def rq_queue() -> Queue:
    return current_app.extensions["rq_queue"]


def enqueue(func: Callable[..., Any], *args: Any, retry: bool = True, **options: Any) -> None:
    """Enqueue func(*args) once the current database transaction commits (dropped if it rolls back)."""
    pending = db.session().info.setdefault(_PENDING, [])
    pending.append((rq_queue(), func, args, retry, options))


@sa.event.listens_for(FlaskSession, "after_commit")
def _enqueue_pending(session: sa.orm.Session) -> None:
    for queue, func, args, retry, options in session.info.pop(_PENDING, []):
        max_retries = current_app.config["JOB_MAX_RETRIES"]
        if retry and max_retries > 0:
            options.setdefault("retry", Retry(max=max_retries, interval=RETRY_INTERVALS[:max_retries]))
        queue.enqueue(func, *args, **options)


@sa.event.listens_for(FlaskSession, "after_rollback")
def _drop_pending(session: sa.orm.Session) -> None:
    session.info.pop(_PENDING, None)


def recorded_job(
    job_type: str,
    target: Callable[..., str | None] | None = None,
    account: Callable[..., int | None] | None = None,
):
    """Record each execution of the decorated job in job_runs: status, timings, error and counts.

    `target` and `account` compute, from the job's arguments, a label for what it works on and the account
    whose data it touches. The job returns a dict of counts (or None). A retryable LLM error is re-raised so
    RQ retries it with backoff; any other error fails the job at once, with its reason kept in job_runs.
    """

    def decorator(func: Callable[..., dict[str, Any] | None]):
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> dict[str, Any]:
            run = _start_run(
                job_type,
                target(*args, **kwargs) if target else None,
                account(*args, **kwargs) if account else None,
                args,
            )
            token = current_job_run_id.set(run.id)
            try:
                counts = func(*args, **kwargs) or {}
            except Exception as error:
                db.session.rollback()
                _finish_run(run.id, "failed", error=_describe(error))
                if not (isinstance(error, LLMError) and error.retryable):
                    _cancel_retries()
                raise
            finally:
                current_job_run_id.reset(token)
            _finish_run(run.id, "done", counts=counts)
            return counts

        JOB_TYPES[job_type] = wrapper
        return wrapper

    return decorator


def _start_run(job_type: str, target: str | None, account_id: int | None, args: tuple[Any, ...]) -> JobRun:
    rq_job = get_current_job()
    run = JobRun(
        job_type=job_type,
        account_id=account_id,
        target=target,
        args=list(args),
        rq_job_id=rq_job.id if rq_job else None,
        status="running",
        started_at=utcnow(),
    )
    db.session.add(run)
    db.session.commit()
    return run


def _finish_run(run_id: int, status: str, *, error: str | None = None, counts: dict | None = None) -> None:
    values: dict[str, Any] = {"status": status, "finished_at": utcnow(), "error": error}
    if counts is not None:
        values["counts"] = counts
    db.session.execute(sa.update(JobRun).where(JobRun.id == run_id).values(**values))
    db.session.commit()


def _describe(error: Exception) -> str:
    if isinstance(error, LLMError):
        return str(error)
    return "".join(traceback.format_exception_only(error)).strip()[:2000]


def _cancel_retries() -> None:
    """A failure that another attempt cannot fix goes straight to the failed registry."""
    rq_job = get_current_job()
    if rq_job is not None:
        rq_job.retries_left = None


def wait_for_redis(seconds: float = 30) -> None:
    """Block until redis answers (the embedded server may still be starting); exit with a clear message."""
    import time

    from redis.exceptions import ConnectionError as RedisConnectionError

    deadline = time.monotonic() + seconds
    while True:
        try:
            redis_connection().ping()
            return
        except (RedisConnectionError, OSError) as e:
            if time.monotonic() > deadline:
                url = current_app.config["REDIS_URL"]
                variable = "the embedded redis" if current_app.config["EMBEDDED_REDIS"] else "REDIS_URL"
                raise SystemExit(f"Cannot reach {variable} at {url}: {e}") from e
            time.sleep(0.2)
