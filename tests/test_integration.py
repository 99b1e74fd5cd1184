"""A real redis-server, real RQ workers and the whole Procfile under honcho."""

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from redis import Redis
from redis.exceptions import RedisError
from rq import Queue, Worker
from rq.job import Job, JobStatus

from tests import sample_jobs
from tests.conftest import POSTGRES_URL, free_port, wait_for, worker_env
from webapp.extensions import db
from webapp.jobs.ping import ping
from webapp.jobs.queue import enqueue
from webapp.models import JobRun

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
# The queues each worker of `make run` serves: one takes replies first, then background work; one replies only.
# The RQ workers of `make run` with a provider: a general and a replies-only process, each of WORKER_THREADS (4)
# threads, of which one alone (the general process's first) takes background work.
WORKERS = [["cairn-replies"]] * 7 + [["cairn-replies", "cairn"]]


def _run_burst_worker(app) -> None:
    subprocess.run(
        [sys.executable, "worker.py", "--burst"], cwd=ROOT, env=worker_env(app), check=True, timeout=60
    )


def _runs() -> list[JobRun]:
    db.session.expire_all()
    return list(db.session.scalars(sa.select(JobRun).order_by(JobRun.id)))


def test_a_real_worker_runs_a_job_in_the_app_context_and_records_it(live_app):
    enqueue(ping)
    db.session.commit()
    [job_id] = Queue("cairn", connection=Redis.from_url(live_app.config["REDIS_URL"])).job_ids

    _run_burst_worker(live_app)

    [run] = _runs()
    assert (run.job_type, run.status, run.counts, run.rq_job_id) == ("ping", "done", {"database": 1}, job_id)


def test_a_real_worker_fails_a_hopeless_job_at_once_and_keeps_the_reason(live_app):
    enqueue(sample_jobs.fails_for_good)
    db.session.commit()
    connection = Redis.from_url(live_app.config["REDIS_URL"])
    [job_id] = Queue("cairn", connection=connection).job_ids

    _run_burst_worker(live_app)

    assert Job.fetch(job_id, connection=connection).get_status() == JobStatus.FAILED
    [run] = _runs()
    assert run.status == "failed" and "bad input" in run.error


def test_make_run_survives_crashes_of_worker_scheduler_and_redis_and_stops_cleanly(tmp_path, fake_llm):
    """What `make run` starts (minus the local model, replaced by the fake): each crashed process comes back
    while web keeps serving, the URL is printed last once all is up, and Ctrl-C leaves nothing behind."""
    instance = tmp_path / "instance"
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")},
        "INSTANCE_PATH": str(instance),
        "LLM_BASE_URL": fake_llm.base_url,
        "PORT": str(port),
        "CAIRN_WEB_PORT": str(port),
        "MCP_PORT": str(free_port()),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    if POSTGRES_URL:
        env["DATABASE_URL"] = POSTGRES_URL
    subprocess.run(["flask", "db", "upgrade"], cwd=ROOT, env=env, check=True, capture_output=True)
    names = subprocess.run(
        [sys.executable, "-m", "webapp.runtime.processes", "names"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert names == ["web", "mcp", "worker", "replies", "scheduler", "redis", "ready"]

    output_file = tmp_path / "honcho.log"
    with output_file.open("wb") as output:
        honcho = subprocess.Popen(
            ["honcho", "start", *names], cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_for(lambda: _healthy(port), seconds=60, what="GET /healthz to report all up")
        wait_for(lambda: "Cairn is up at" in output_file.read_text(), what="the URL to be printed")
        web = _processes_of(instance, "gunicorn")
        # web relays /mcp to the MCP process, which refuses a request without an API key
        wait_for(lambda: _mcp_status(port) == 401, what="POST /mcp/<agent> to reach the MCP process")
        wait_for(lambda: _worker_queues(instance) == WORKERS, what="a general and a replies-only worker")
        for crashed in ("worker.py", "schedule run", "redis-server"):  # both workers, for worker.py
            before = _processes_of(instance, crashed)
            commands = _commands(before)
            assert commands
            for pid in before:
                os.kill(pid, signal.SIGKILL)
            wait_for(
                lambda c=crashed, b=before, e=commands: _commands(_processes_of(instance, c) - b) >= e,
                what=f"{crashed} to restart",
            )
            assert _answers(port, "/login") == 200  # web kept serving
        # The restarted worker, on the restarted redis, runs the next job.
        wait_for(lambda: _enqueue_ping(env), seconds=60, what="a job to be enqueued")
        wait_for(lambda: "Job OK" in output_file.read_text(), seconds=60, what="the job to run")
        wait_for(lambda: _healthy(port), seconds=60, what="GET /healthz to report all up again")
        wait_for(lambda: _worker_queues(instance) == WORKERS, what="both workers back on the new redis")
        assert _processes_of(instance, "gunicorn") == web, "web was restarted"
    finally:
        os.killpg(honcho.pid, signal.SIGINT)  # what Ctrl-C in the terminal sends
        honcho.wait(30)
    text = output_file.read_text()

    leftovers = _processes_of(instance, "")
    assert not leftovers, f"processes left behind: {leftovers}\n{text}"
    assert not (instance / "redis.sock").exists()
    assert "FutureWarning" not in text
    assert "restarting in 1 s" in text


def _enqueue_ping(env: dict[str, str]) -> bool:
    return subprocess.run(["flask", "jobs", "ping"], cwd=ROOT, env=env, capture_output=True).returncode == 0


def _worker_queues(instance: Path) -> list[list[str]]:
    """The queues of each worker registered with the embedded redis."""
    try:
        with Redis(unix_socket_path=str(instance / "redis.sock")) as connection:
            return sorted(worker.queue_names() for worker in Worker.all(connection=connection))
    except (RedisError, OSError):
        return []  # redis restarting


def _commands(pids: set[int]) -> set[str]:
    """The command lines of these processes (a worker's scheduler, which RQ forks from it, has the same)."""
    commands = set()
    for pid in pids:
        try:
            commands.add(Path(f"/proc/{pid}/cmdline").read_text())
        except OSError:
            continue  # gone
    return commands


def _processes_of(instance: Path, command: str) -> set[int]:
    """Live processes started for this instance whose command line has command: they inherit INSTANCE_PATH, or
    (redis-server, which overwrites its environment with its title) name the instance on their command line."""
    found = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        ours = f"INSTANCE_PATH={instance}".encode() in environ or str(instance) in cmdline
        if ours and command in cmdline and state != "Z":
            found.add(int(proc.name))
    return found


def _answers(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.status


def _mcp_status(port: int) -> int | None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp/ada", b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def _healthy(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return json.load(response)
    except (urllib.error.URLError, OSError):
        return None  # not up yet (gunicorn listens before its worker loaded the app), or 503 while starting


def test_a_real_worker_consolidates_a_chat_with_concurrent_agents(live_app, fake_llm):
    import json
    from datetime import timedelta

    import time_machine

    from tests import factories
    from webapp.jobs.consolidation import consolidate_stale_chats
    from webapp.models import AgentMemory
    from webapp.timeutil import utcnow

    admin = factories.user(factories.account())
    agents = [factories.agent(admin.account, name) for name in ("Ada", "Basil", "Cleo")]
    chat = factories.chat(admin.account, agents)
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, "We agreed to plant tulips in March.", author=admin)
    for agent in agents:
        fake_llm.reply(
            json.dumps({"journal": [f"{agent.name}: tulips in March"], "core": []}), model=agent.model_id
        )
    enqueue(consolidate_stale_chats)
    db.session.commit()

    _run_burst_worker(live_app)  # the finder enqueues the chat's job; the burst worker runs it too

    db.session.expire_all()
    contents = sorted(db.session.scalars(sa.select(AgentMemory.content)))
    assert contents == ["Ada: tulips in March", "Basil: tulips in March", "Cleo: tulips in March"]
    # A run a worker of an earlier test finished late may be there too; a second consolidation may not.
    consolidation_runs = [r for r in _runs() if r.job_type in ("consolidate_finder", "consolidate")]
    assert [(r.job_type, r.status) for r in consolidation_runs] == [
        ("consolidate_finder", "done"),
        ("consolidate", "done"),
    ]
