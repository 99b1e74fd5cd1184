"""An RQ worker that runs every job inside the Flask app context: `python worker.py [--burst] [--replies-only]`.

A worker process runs up to WORKER_THREADS jobs at once, each on a thread of its own: a reply spends its time
waiting for the model, so one process answers many chats at the same time instead of one after another. Each
thread is an RQ worker of its own (counted by `rq info` and /healthz). Replies are served on every thread;
background memory work on the first alone, so a process runs its memory jobs one after another as it always
did. With --replies-only no thread takes background work: a worker in the middle of an hour-long consolidation
takes no reply, so at least one such worker keeps replies answered whatever the background work.

Jobs run in the worker's own process, not in a work horse forked per job: a fork cost each job a cold start
(new database and Redis connections, SQLAlchemy's statement cache and the model client's connection pool empty
again), about half a second above the model call (bench/job_overhead.py). A job killed with its worker
(kill -9, OOM) is found by the sweep of another worker, as its run's lock stops being renewed.

It rides out a Redis outage: RQ retries its dequeue with backoff, a thread's worker registers itself again if
Redis lost its data, and any other Redis error that ends RQ's work loop starts a fresh worker once Redis
answers. The sweep for lost or interrupted work (webapp.jobs.sweep) runs on a thread of its own: it must run
exactly when Redis lost its data, so it cannot itself be a job in Redis.

SIGTERM or Ctrl-C stops a worker warmly: idle threads stop within STOP_CHECK_SECONDS (during a Redis outage, the
worker leaves at once if no job is in hand), busy ones once their job ends. A second signal stops it at once;
the sweep of another worker picks up the jobs it cut.
"""

import argparse
import logging
import multiprocessing
import signal
import sys
import threading
import time
from types import FrameType

import sqlalchemy as sa
from flask import Flask
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from redis import Redis
from redis.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq import Queue, SimpleWorker
from rq.executions import Execution
from rq.job import Job
from rq.timeouts import TimerDeathPenalty

from webapp import config, jobs, llm, prompting, tokens
from webapp.extensions import db
from webapp.factory import create_app
from webapp.jobs.queue import redis_connection, wait_for_redis, worker_queues
from webapp.jobs.sweep import sweep_forever
from webapp.llm import targets
from webapp.runtime import set_loaded_aside
from webapp.runtime.health import WORKER_TTL_SECONDS
from webapp.search import embedder

log = logging.getLogger("rq.worker")  # printed by the handler RQ sets up
RECONNECT_DELAYS = [0.5, 1, 2, 5]  # seconds between attempts while Redis is unreachable, the last repeated
STOP_CHECK_SECONDS = 2  # an idle thread waits for a job this long at a time, then looks whether to stop


class JobsInHand:
    """How many of the process's threads are running a job (`with jobs_in_hand:` around each)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self.count -= 1


jobs_in_hand = JobsInHand()


class AppWorker(SimpleWorker):
    """Runs each job in this process (no fork), on the thread that took it, inside a fresh app context."""

    app: Flask
    stop: threading.Event  # set by the process's signal handler: finish the job in hand, take no other
    death_penalty_class = TimerDeathPenalty  # RQ's default time limit (SIGALRM) works in the main thread only
    max_connection_wait_time = 5.0  # RQ's dequeue backoff cap: back within seconds of Redis returning

    # RQ's work loop checks _stop_requested between jobs; here it is the process's stop event, so a signal
    # received by the main thread reaches every thread's worker, those started after a Redis outage included.
    @property
    def _stop_requested(self) -> bool:
        return self.stop.is_set()

    @_stop_requested.setter
    def _stop_requested(self, value: bool) -> None:
        if value:
            self.stop.set()

    def _install_signal_handlers(self) -> None:
        """Signals reach the main thread alone, whose handler (install_stop_handlers) stops every worker."""

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        with self.app.app_context(), jobs_in_hand:
            try:
                return super().perform_job(job, queue, execution)
            finally:
                db.session.remove()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """RQ's wait for a job, in rounds of STOP_CHECK_SECONDS: nothing else interrupts an idle thread."""
        if timeout is None or max_idle_time is not None:  # burst mode, or a caller's own idle limit
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        while not self.stop.is_set():
            found = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time=STOP_CHECK_SECONDS)
            if found is not None:
                return found
        return None

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and not self.connection.exists(self.key):
            self.register_birth()  # Redis restarted without its data: be counted as a live worker again
        super().heartbeat(timeout, pipeline)


def serve(queues: list[Queue], *, burst: bool, with_scheduler: bool) -> None:
    """One thread's work: an RQ work loop on `queues`, started afresh after Redis was lost, until stopped."""
    with AppWorker.app.app_context():
        while True:
            worker = AppWorker(queues, connection=redis_connection(), worker_ttl=WORKER_TTL_SECONDS)
            try:
                worker.work(burst=burst, with_scheduler=with_scheduler)
            except (RedisConnectionError, RedisTimeoutError) as e:
                log.error("Lost Redis while stopping the work loop: %s", e)
            if burst or AppWorker.stop.is_set() or not wait_until_reachable(redis_connection()):
                return
            log.warning("Redis answers again; starting a fresh work loop")


def thread_queues(threads: int, replies_only: bool) -> list[list[Queue]]:
    """The queues of each of a process's threads: the first serves background work too, unless replies_only."""
    return [worker_queues(replies_only=replies_only or n > 0) for n in range(threads)]


def wait_until_reachable(connection: Redis) -> bool:
    """Block until Redis answers (True), retrying with backoff for as long as it takes, or until the worker is
    asked to stop (False)."""
    for attempt in range(sys.maxsize):
        try:
            connection.ping()
            return True
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:
            delay = RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)]
            if attempt == 0:
                log.error("Redis is unreachable (%s); retrying until it answers", e)
            if AppWorker.stop.wait(delay):
                return False
    return False


def wait_for_threads(threads: list[threading.Thread]) -> None:
    """Until every thread has left its work loop, or, once asked to stop with no job in hand, a few seconds more
    (idle threads leave within STOP_CHECK_SECONDS): a thread RQ keeps retrying a lost Redis has nothing to
    finish. In short waits: the signal handler runs on this thread between them."""
    idle_since = None
    while any(thread.is_alive() for thread in threads):
        if not AppWorker.stop.is_set() or jobs_in_hand.count:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 2 * STOP_CHECK_SECONDS + 1:  # theirs, and a margin
            log.warning("Leaving without the threads still waiting for Redis; no job was in hand")
            return
        time.sleep(0.2)


def stop_children() -> None:
    """Stop RQ's scheduler process, which exit would otherwise wait for, if its thread did not stop it."""
    for child in multiprocessing.active_children():
        child.terminate()


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGTERM or SIGINT: a warm stop (jobs in hand finish); the second one: exit now."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("Stopping now; the jobs in hand are cut and will be picked up again")
            stop_children()
            raise SystemExit(1)
        log.info("Stopping once the jobs in hand are done (signal again to stop now)")
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def preload(app: Flask) -> None:
    """Load at start what the first job would otherwise wait for: the tokenizer (over a second), the local embedder
    (its imports and model, half a second: a reply embeds its query), the job modules, the prompt templates, the
    model client's API classes and response validators, and the ORM mappers."""
    tokens.encoder()
    embedder.preload(app)
    jobs.load_all()
    prompting.compile_all()
    with app.app_context():  # the openai SDK imports its resources on first use (a client, kept, made here)
        _ = llm.client_for(targets.for_environment(app.config["DEFAULT_MODEL_ID"])).chat.completions
    for response_type in (ChatCompletion, ChatCompletionChunk):  # pydantic builds validators on first use
        response_type.model_rebuild(force=True)
    sa.orm.configure_mappers()


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="worker.py", description="Run Cairn's jobs (an RQ worker).")
    parser.add_argument("--burst", action="store_true", help="stop once the queues are empty")
    parser.add_argument(
        "--replies-only", action="store_true", help="serve only the reply queue, never background memory work"
    )
    return parser.parse_args(argv[1:])


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    try:
        app = create_app()
    except config.ConfigError as error:
        raise SystemExit(f"Cairn cannot start: {error}") from None
    AppWorker.app, AppWorker.stop = app, threading.Event()
    preload(app)  # the job modules among it: the sweep queues any job type again from its job_runs row
    set_loaded_aside()
    install_stop_handlers(AppWorker.stop)
    threading.Thread(target=sweep_forever, args=(app, AppWorker.stop), name="sweep", daemon=True).start()
    with app.app_context():
        wait_for_redis()
        every_queues = thread_queues(app.config["WORKER_THREADS"], args.replies_only)
    threads = [
        threading.Thread(
            target=serve,
            args=(queues,),
            kwargs={"burst": args.burst, "with_scheduler": n == 0},  # RQ's scheduler: retries after a wait
            name=f"jobs-{n}",
            daemon=True,  # a second signal exits without waiting for them
        )
        for n, queues in enumerate(every_queues)
    ]
    for thread in threads:
        thread.start()
    wait_for_threads(threads)
    AppWorker.stop.set()  # burst mode: every thread is done; stop the sweep
    stop_children()


if __name__ == "__main__":
    main(sys.argv)
