"""An RQ worker that runs every job inside the Flask app context: `python worker.py [--burst] [--replies-only]`.

It rides out a Redis outage: RQ retries its dequeue with backoff, the worker registers itself again if Redis
lost its data, and any other Redis error that ends RQ's work loop starts a fresh worker once Redis answers.
It serves the reply queue before the background queue, and sweeps for lost or interrupted work (webapp.jobs.queue)
in a thread: the sweep must run exactly when Redis lost its data, so it cannot itself be a job in Redis. With
--replies-only it serves the reply queue alone: a worker in the middle of an hour-long consolidation cannot take
a reply, so at least one such worker keeps replies answered whatever the background work.

Jobs run in the worker's own process, one after another, not in a work horse forked per job: a fork cost each
job a cold start (new database and Redis connections, SQLAlchemy's statement cache and the model client's
connection pool empty again), about half a second above the model call (bench/job_overhead.py). A job killed
with its worker (kill -9, OOM) is found by the sweep of another worker, as its run's lock stops being renewed.
"""

import argparse
import logging
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

from webapp import config, jobs, prompting, tokens
from webapp.extensions import db
from webapp.factory import create_app
from webapp.jobs.queue import redis_connection, sweep_forever, wait_for_redis, worker_queues
from webapp.web.health import WORKER_TTL_SECONDS

log = logging.getLogger("rq.worker")  # printed by the handler RQ sets up
RECONNECT_DELAYS = [0.5, 1, 2, 5]  # seconds between attempts while Redis is unreachable, the last repeated


class AppWorker(SimpleWorker):
    """Runs each job in this process (no fork), inside a fresh app context."""

    app = None
    max_connection_wait_time = 5.0  # RQ's dequeue backoff cap: back within seconds of Redis returning
    stopping = False

    def perform_job(self, job: Job, queue: Queue, execution: Execution) -> bool:
        with self.app.app_context():
            try:
                return super().perform_job(job, queue, execution)
            finally:
                db.session.remove()

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        super().request_stop(signum, frame)

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and not self.connection.exists(self.key):
            self.register_birth()  # Redis restarted without its data: be counted as a live worker again
        super().heartbeat(timeout, pipeline)


def wait_until_reachable(connection: Redis) -> None:
    """Block until Redis answers, retrying with backoff for as long as it takes."""
    for attempt in range(sys.maxsize):
        try:
            connection.ping()
            return
        except (RedisConnectionError, RedisTimeoutError, OSError) as e:
            delay = RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)]
            if attempt == 0:
                log.error("Redis is unreachable (%s); retrying until it answers", e)
            time.sleep(delay)


def preload(app: Flask) -> None:
    """Load at start what the first job would otherwise wait for: the tokenizer (over a second), the job modules,
    the prompt templates, the model client's API classes and response validators, and the ORM mappers."""
    tokens.encoder()
    jobs.load_all()
    prompting.compile_all()
    _ = app.extensions["llm_client"].chat.completions  # the openai SDK imports its resources on first use
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
    AppWorker.app = app
    preload(app)  # the job modules among it: the sweep queues any job type again from its job_runs row
    stop = threading.Event()
    threading.Thread(target=sweep_forever, args=(app, stop), name="sweep", daemon=True).start()
    with app.app_context():
        wait_for_redis()
        while True:
            queues = worker_queues(replies_only=args.replies_only)
            worker = AppWorker(queues, connection=redis_connection(), worker_ttl=WORKER_TTL_SECONDS)
            try:
                worker.work(burst=args.burst, with_scheduler=True)
            except (RedisConnectionError, RedisTimeoutError) as e:
                log.error("Lost Redis while stopping the work loop: %s", e)
            if args.burst or worker.stopping:
                stop.set()
                return
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # RQ's handlers would ask the lost Redis
            signal.signal(signal.SIGINT, signal.default_int_handler)
            wait_until_reachable(redis_connection())
            log.warning("Redis answers again; starting a fresh work loop")


if __name__ == "__main__":
    main(sys.argv)
