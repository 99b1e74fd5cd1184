"""Background jobs: the one way to enqueue, to run a recorded job (recorded_job), and to hold a lock.

The database, not Redis, is the record of work to do. `enqueue` writes a "queued" job_runs row in the caller's
transaction and puts the job on RQ only once that commits; if Redis is down then, or later loses its data, the
sweep (run by every worker, one at a time, every few seconds) puts the row's job back. A running job holds a
lock named after its target whose value is its run id, renewed every HEARTBEAT_SECONDS: a killed worker's lock
expires within LOCK_SECONDS, and the sweep then closes its run as "interrupted" and queues it again.

The runs themselves (JobKind, JOB_TYPES, the job_runs rows) are webapp.jobs.runs; the sweep is webapp.jobs.sweep.
"""

import functools
import hashlib
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa
from flask import Flask, current_app
from flask_sqlalchemy.session import Session as FlaskSession
from redis import Redis
from redis.exceptions import LockError, RedisError
from rq import Queue, Retry, get_current_job
from rq.timeouts import JobTimeoutException

from webapp.extensions import db
from webapp.jobs.runs import (
    JOB_TYPES,
    JobKind,
    add_queued,
    finish_run,
    queue_next_attempt,
    take_run,
)
from webapp.llm import LLMError
from webapp.models import Agent, Chat, JobRun, Message
from webapp.models.runs import current_job_run_id
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)

LOCK_SECONDS = 10  # a lock whose holder stopped renewing it is free after this
HEARTBEAT_SECONDS = 2  # how often a holder renews its locks
_PENDING = "cairn_pending_jobs"

# Time limits (RQ stops a job that runs longer, raising JobTimeoutException in it). A job's limit follows from
# the model requests it makes one after another, each allowed LLM_TIMEOUT_SECONDS, plus a margin for the
# database, tool and Redis work around them. A reply makes at most REPLY_MAX_TOOL_TURNS requests per agent
# it answers; a summary one. Consolidation (chunks of up to 100k tokens, each request taking up to the full
# model timeout), compaction (batches) and reflection (pages) make as many as their backlog needs: they get
# BACKLOG_CALLS requests' time, an hour at the default timeout, and since they commit their progress call by
# call (cursors, the cut, promotions), one stopped by its limit loses at most the calls in flight, and the
# next run continues from there.
JOB_MARGIN_SECONDS = 60
BACKLOG_CALLS = 30


def job_target(**ids: int | list[int]) -> str:
    """The label of what a job works on, in job_runs.target: job_target(chat=3) is "chat:3",
    job_target(chat=3, agent=2) "chat:3 agent:2", job_target(messages=[4, 5]) "messages:4,5"."""
    return " ".join(
        f"{name}:{','.join(map(str, value)) if isinstance(value, list) else value}"
        for name, value in ids.items()
    )


def target_ids(target: str | None, name: str) -> list[int]:
    """The ids a job target gives for one name: target_ids("chat:3 agent:2", "agent") is [2]."""
    for part in (target or "").split():
        key, _, ids = part.partition(":")
        if key == name:
            return [int(i) for i in ids.split(",") if i.isdigit()]
    return []


def init_app(app: Flask) -> None:
    app.extensions["redis"] = Redis.from_url(
        app.config["REDIS_URL"], socket_connect_timeout=5, socket_timeout=10, health_check_interval=30
    )


def redis_connection() -> Redis:
    return current_app.extensions["redis"]


def rq_queue(name: str = "background") -> Queue:
    """The RQ queue for replies ("replies") or for everything else ("background")."""
    base = current_app.config["RQ_QUEUE"]
    return Queue(f"{base}-replies" if name == "replies" else base, connection=redis_connection())


def worker_queues(replies_only: bool = False) -> list[Queue]:
    """The queues a worker serves, in order: a reply is always taken before background memory work. A
    replies-only worker never takes background work, so a long consolidation cannot keep a reply waiting."""
    if replies_only:
        return [rq_queue("replies")]
    return [rq_queue("replies"), rq_queue("background")]


# --- locks and once-keys: the one place Cairn takes a Redis lock or a once-only key ---
# (Cairn's other keys: each reply's Stop flag, cairn:stop:<id>, in jobs/replies.py; each user's live-stream
# slots, cairn:streams:user:<id>, and the chats' pub/sub channels in events.py; Flask-Limiter's counters;
# RQ's and rq-scheduler's own.)


@contextmanager
def held_lock(name: str, token: str | None = None) -> Iterator[bool]:
    """Hold the named lock while the block runs; yields False (and holds nothing) when another holds it.

    A thread renews the lock every HEARTBEAT_SECONDS, so it dies with its process: LOCK_SECONDS after a
    kill -9 anyone may take it. `token` is the value others read with lock_holder().
    """
    lock = redis_connection().lock(f"cairn:lock:{name}", timeout=LOCK_SECONDS, thread_local=False)
    if not lock.acquire(blocking=False, token=token or uuid.uuid4().hex):
        yield False
        return
    stop = threading.Event()
    keeper = threading.Thread(target=_keep, args=(lock, stop), name=f"lock {name}", daemon=True)
    keeper.start()
    try:
        yield True
    finally:
        stop.set()
        keeper.join()
        try:
            lock.release()
        except (LockError, RedisError):
            log.warning("lock %s was lost before its release", name)


def _keep(lock: Any, stop: threading.Event) -> None:
    """Renew the lock until stopped; take it back if Redis lost it (a restart without persistence)."""
    while not stop.wait(HEARTBEAT_SECONDS):
        try:
            if not lock.owned():
                lock.do_acquire(lock.local.token)
            lock.reacquire()
        except (LockError, RedisError) as error:
            log.warning("could not renew lock %s: %s", lock.name, error)


def lock_holder(name: str) -> str | None:
    """The token of whoever holds the named lock now, or None."""
    value = redis_connection().get(f"cairn:lock:{name}")
    return value.decode() if value is not None else None


def once(name: str, seconds: float) -> bool:
    """True the first time in `seconds` that anyone asks for this name (across every process)."""
    return bool(redis_connection().set(f"cairn:once:{name}", "1", nx=True, px=int(seconds * 1000)))


def _recently(name: str) -> bool:
    """Whether once(name) said True within its period (Redis down: no, let the work happen)."""
    try:
        return bool(redis_connection().exists(f"cairn:once:{name}"))
    except RedisError:
        return False


# --- enqueueing ---


def enqueue(func: Callable[..., Any], *args: Any, once_per: float | None = None) -> JobRun | None:
    """Record a queued run of func(*args) in this transaction; RQ gets the job once it commits.

    None when nothing was added: the job kind is `unique` and a run for the same target is already waiting
    (see waiting_run) or being added by a concurrent transaction, or once_per (seconds) says the same job and
    target was enqueued that recently. That period starts only when this transaction commits, so a rollback
    does not block the next attempt.
    """
    kind: JobKind = func.job_kind
    target = kind.target_of(args)
    if kind.unique and (not _only_adder(kind, target) or waiting_run(func, *args) is not None):
        return None
    once_name = f"{kind.job_type}:{target}" if once_per else None
    if once_name and _recently(once_name):
        return None
    run = add_queued(kind, list(args), target, kind.account_of(args))
    after_commit(run.rq_job_id, func, list(args), once_name, once_per)
    return run


def waiting_run(func: Callable[..., Any], *args: Any) -> JobRun | None:
    """The run of func for the same target that a new one would duplicate: a queued one (and, for kinds
    unique while "active", a running one)."""
    kind: JobKind = func.job_kind
    statuses = ("queued",) if kind.unique == "queued" else ("queued", "running")
    return db.session.scalar(
        sa.select(JobRun)
        .where(JobRun.job_type == kind.job_type, JobRun.target == kind.target_of(args))
        .where(JobRun.status.in_(statuses))
        .order_by(JobRun.id)
        .limit(1)
    )


def _only_adder(kind: JobKind, target: str | None) -> bool:
    """Make this transaction the only one that may add a run of this kind for this target until it ends, so
    the check for a waiting run and the insert are one step (two posts at once must not queue two summaries).
    False when a concurrent transaction holds that right: it is adding the run this one would duplicate."""
    if db.session.get_bind().dialect.name == "postgresql":  # a lock that ends with the transaction
        digest = hashlib.blake2b(kind.lock_name(target).encode(), digest_size=8).digest()
        key = int.from_bytes(digest, "big", signed=True)
        return bool(db.session.scalar(sa.select(sa.func.pg_try_advisory_xact_lock(key))))
    # SQLite has one writer at a time: writing (nothing) now waits for any other writer, and keeps the others
    # out until this transaction ends; the check then reads what they committed.
    db.session.execute(
        sa.update(JobRun)
        .where(sa.false())
        .values(status=JobRun.status)
        .execution_options(synchronize_session=False)
    )
    return True


def after_commit(
    job_id: str,
    func: Callable[..., Any],
    args: list[Any],
    once_name: str | None = None,
    once_per: float | None = None,
) -> None:
    db.session().info.setdefault(_PENDING, []).append((job_id, func, args, once_name, once_per))


@sa.event.listens_for(FlaskSession, "after_commit")
def _enqueue_pending(session: sa.orm.Session) -> None:
    for job_id, func, args, once_name, once_per in session.info.pop(_PENDING, []):
        try:
            if once_name:
                once(once_name, once_per)
            push(job_id, func, args)
        except RedisError as error:  # the queued row stays: the sweep puts it on the queue once Redis is back
            log.warning("could not queue job %s now (%s); the sweep will", job_id, error)


@sa.event.listens_for(FlaskSession, "after_rollback")
def _drop_pending(session: sa.orm.Session) -> None:
    session.info.pop(_PENDING, None)


def push(job_id: str, func: Callable[..., Any], args: list[Any]) -> None:
    kind: JobKind = func.job_kind
    max_retries, intervals = current_app.config["JOB_MAX_RETRIES"], current_app.config["JOB_RETRY_SECONDS"]
    retry = Retry(max=max_retries, interval=intervals[:max_retries]) if max_retries > 0 else None
    rq_queue(kind.queue).enqueue_call(
        func, args=tuple(args), job_id=job_id, retry=retry, timeout=kind.timeout_for(args)
    )


def model_time(calls: int) -> int:
    """Seconds for `calls` model requests one after another, each allowed LLM_TIMEOUT_SECONDS, and the work
    around them: a job's time limit."""
    return int(calls * current_app.config["LLM_TIMEOUT_SECONDS"]) + JOB_MARGIN_SECONDS


def backlog_time(*_args: Any) -> int:
    """The time limit of a job that works through a backlog, a committed step per model request."""
    return model_time(BACKLOG_CALLS)


def timed_out() -> str:
    """What a run, and what it was writing, says when RQ stopped it at its time limit."""
    job = get_current_job()
    limit = f" of {job.timeout} seconds" if job is not None and job.timeout else ""
    return f"Timed out: the job ran past its time limit{limit} and was stopped."


# --- running ---


def recorded_job(
    job_type: str,
    title: str,
    target: Callable[..., str | None] | None = None,
    of: type[Agent | Chat | Message] | None = None,
    *,
    queue: str = "background",
    unique: str | None = None,
    resume: bool = True,
    on_interrupt: Callable[[JobRun, bool], None] | None = None,
    timeout: Callable[..., int] | None = None,
) -> Callable[[Callable[..., dict | None]], Callable[..., dict | None]]:
    """Record each execution of the decorated job in job_runs and hold its target's lock while it runs.

    `title` is what pages call the job ("Refine core memory"). `target` computes, from the job's arguments, a label for what it works on; `of` is the model whose id (or
    list of ids) the first argument is, and the run is recorded under that record's account. One run per
    target at a time: a second one finds the lock held and skips. `timeout(*args)` is the job's time limit in
    seconds (see model_time; None: NO_MODEL_SECONDS), after which RQ stops it and its run fails as timed out.
    The job returns a dict of counts (or None); an error with a `counts` attribute has those recorded with the
    failure. A retryable LLM error is re-raised so RQ retries it with backoff (a queued row stands for the next
    attempt); any other error fails the job at once, its reason in job_runs.
    """

    def decorator(func: Callable[..., dict[str, Any] | None]):
        kind = JobKind(job_type, title, target, of, queue, unique, resume, on_interrupt, timeout)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> dict[str, Any]:
            run = take_run(kind, args)
            if run is None:
                return {"skipped": "superseded by a newer run"}
            with held_lock(kind.lock_name(run.target), token=str(run.id)) as mine:
                if not mine:
                    counts = {"skipped": "another run of this target is running"}
                    finish_run(run.id, "done", counts=counts)
                    return counts
                return _execute(run.id, func, args, kwargs)

        wrapper.job_kind = kind
        if job_type in JOB_TYPES and JOB_TYPES[job_type].__qualname__ != wrapper.__qualname__:
            raise ValueError(f"two jobs are recorded as {job_type!r}; the sweep could not tell them apart")
        JOB_TYPES[job_type] = wrapper
        return wrapper

    return decorator


def _execute(run_id: int, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    db.session.execute(
        sa.update(JobRun).where(JobRun.id == run_id).values(status="running", started_at=utcnow())
    )
    db.session.commit()
    token = current_job_run_id.set(run_id)
    try:
        counts = func(*args, **kwargs) or {}
    except Exception as error:
        db.session.rollback()
        # An error may carry the counts of the work done before it (what the agents that finished saved).
        finish_run(run_id, "failed", error=_describe(error), counts=getattr(error, "counts", None))
        if isinstance(error, LLMError) and error.retryable:
            if _retries_left() > 0:
                queue_next_attempt(run_id)
        else:
            _cancel_retries()
        raise
    finally:
        current_job_run_id.reset(token)
    finish_run(run_id, "done", counts=counts)
    return counts


def _describe(error: Exception) -> str:
    if isinstance(error, LLMError):
        return str(error)
    if isinstance(error, JobTimeoutException):
        return timed_out()
    return "".join(traceback.format_exception_only(error)).strip()[:2000]


def _retries_left() -> int:
    rq_job = get_current_job()
    return (rq_job.retries_left or 0) if rq_job else 0


def _cancel_retries() -> None:
    """A failure that another attempt cannot fix goes straight to the failed registry."""
    rq_job = get_current_job()
    if rq_job is not None:
        rq_job.retries_left = None


def wait_for_redis(seconds: float = 30) -> None:
    """Block until redis answers (the embedded server may still be starting); exit with a clear message."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            redis_connection().ping()
            return
        except (RedisError, OSError) as e:
            if time.monotonic() > deadline:
                raise SystemExit(unreachable_redis(e)) from e
            time.sleep(0.2)


def unreachable_redis(error: BaseException) -> str:
    """What to say when Redis does not answer."""
    url = urlsplit(current_app.config["REDIS_URL"])
    if url.password:
        url = url._replace(netloc=url.netloc.replace(f":{url.password}@", ":***@"))
    variable = "the embedded redis" if current_app.config["EMBEDDED_REDIS"] else "REDIS_URL"
    return f"Cannot reach {variable} at {url.geturl()}: {error}"
