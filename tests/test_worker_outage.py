"""A real worker rides out a Redis outage: it reconnects when Redis is back and runs the next queued job."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from redis import Redis

from tests.conftest import wait_for, worker_env
from webapp.extensions import db
from webapp.jobs.ping import ping
from webapp.jobs.queue import enqueue
from webapp.models import JobRun
from webapp.runtime import health
from webapp.runtime.processes import redis_server_argv

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
OUTAGE_SECONDS = 5


class RedisProcess:
    """A redis-server on a unix socket that can be stopped and started again at the same address."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.socket = directory / "redis.sock"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.process = subprocess.Popen(redis_server_argv(self.socket, self.directory))
        connection = Redis(unix_socket_path=str(self.socket))
        wait_for(lambda: self.socket.exists() and connection.ping(), what="redis-server")
        connection.close()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)


@pytest.fixture
def redis_process(tmp_path):
    server = RedisProcess(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def redis_server(redis_process):
    """live_app's redis: the restartable one."""
    return f"unix://{redis_process.socket}"


def _live_workers() -> bool:
    return health.check_workers().ok


def test_a_worker_rides_out_a_redis_outage_and_then_runs_a_queued_job(live_app, redis_process):
    worker = subprocess.Popen([sys.executable, "worker.py"], cwd=ROOT, env=worker_env(live_app))
    try:
        wait_for(_live_workers, seconds=120, what="the worker to register")

        redis_process.kill()
        time.sleep(OUTAGE_SECONDS)  # the outage itself, not a wait for a result
        assert worker.poll() is None, "the worker exited during the outage"
        redis_process.start()  # an empty Redis, as after a restart without persistence

        enqueue(ping)
        db.session.commit()
        done = wait_for(_runs_done, seconds=120, what="the queued job to run")

        assert done == 1
        assert worker.poll() is None
        wait_for(_live_workers, seconds=120, what="the worker to be counted as live again")
    finally:
        worker.terminate()
        assert worker.wait(20) == 0


def _runs_done() -> int:
    db.session.expire_all()
    return db.session.scalar(sa.select(sa.func.count()).select_from(JobRun).where(JobRun.status == "done"))


def test_a_worker_asked_to_stop_during_a_redis_outage_leaves_promptly(live_app, redis_process):
    """With no job in hand there is nothing to finish: a supervisor's stop during an outage must not wait for
    Redis (`make run` kills what has not stopped after 4 s)."""
    worker = subprocess.Popen(
        [sys.executable, "worker.py"], cwd=ROOT, env={**worker_env(live_app), "WORKER_THREADS": "3"}
    )
    try:
        wait_for(_live_workers, seconds=120, what="the worker to register")
        redis_process.kill()
        time.sleep(1)  # the threads find Redis gone

        worker.send_signal(signal.SIGTERM)

        assert worker.wait(10) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        redis_process.start()  # for the fixture's teardown
