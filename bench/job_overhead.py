"""Where a reply job's time goes above its model call, with a real worker (`python worker.py`), redis-server
and database, and a model that answers after MODEL_LATENCY.

    .venv/bin/python -m bench.job_overhead [--replies 30]    # PostgreSQL (BENCH_DATABASE_URL or the local cluster)

Printed: what a worker could pay per job (a fork of the loaded worker, a fresh database connection, the app
context, tiktoken's encoder loaded cold in a new process), then for replies sent one after another (each
enqueued once the previous one is done): enqueue-to-done minus the model call, split into the wait before the
job's run starts (dequeue, and a fork when the worker forks) and the job's own time above its model call (what
bench.load reports as the reply job overhead).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa
from redis import Redis

from bench.load_stack import _migrated_app, _wait, database_url, percentile, seed_users
from tests.fake_llm import FakeLLM
from webapp import tokens
from webapp.extensions import db
from webapp.jobs.replies import request_replies
from webapp.models import Chat, JobRun, LlmCall, Message
from webapp.runtime.processes import redis_server_argv

ROOT = Path(__file__).resolve().parent.parent
MODEL_LATENCY = 0.3


def _best_ms(func, repeat: int = 20) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        func()
        best = min(best, (time.perf_counter() - started) * 1000)
    return best


def _fork_and_exit() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _reconnect() -> None:
    db.engine.dispose(close=False)
    db.session.execute(sa.text("SELECT 1"))
    db.session.remove()


def _cold_encoder_ms() -> float:
    code = "import time; from webapp import tokens; t = time.perf_counter(); tokens.encoder(); print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return float(out.stdout.strip()) * 1000


def components(app) -> None:
    tokens.encoder()  # loaded, as the worker preloads it, before the forks measured below
    print("what a worker could pay per job (best of 20, this process)")
    print(f"  fork + exit of the loaded process     {_best_ms(_fork_and_exit):8.1f} ms")
    print(f"  app context push + pop                {_best_ms(_context(app)):8.1f} ms")
    print(f"  fresh database connection + SELECT 1  {_best_ms(_reconnect):8.1f} ms")
    print(f"  tiktoken encoder, cold (new process)  {_cold_encoder_ms():8.1f} ms")


def _context(app):
    def push_pop() -> None:
        with app.app_context():
            pass

    return push_pop


def replies(chat_id: int, count: int) -> None:
    waits, overheads, totals = [], [], []
    for _ in range(count + 1):  # the first one warms the worker up and is not counted
        chat = db.session.get(Chat, chat_id)
        chat.add_message(role="user", content="How are you?", status="done")
        [reply] = request_replies(chat, list(chat.agents))
        started = time.perf_counter()
        db.session.commit()  # the job goes on the queue now
        reply_id = reply.id
        while True:
            db.session.rollback()
            status = db.session.scalar(sa.select(Message.status).where(Message.id == reply_id))
            if status in ("done", "failed"):
                break
            time.sleep(0.005)
        total = (time.perf_counter() - started) * 1000
        run = _finished_run(f"messages:{reply_id}")
        model = db.session.scalar(
            sa.select(sa.func.sum(LlmCall.latency_ms)).where(LlmCall.job_run_id == run.id)
        )
        own = (run.finished_at - run.started_at).total_seconds() * 1000 - model
        totals.append(total - model)
        overheads.append(own)
        waits.append(total - model - own)
    totals, waits, overheads = totals[1:], waits[1:], overheads[1:]
    print(f"\n{count} replies one after another, model {MODEL_LATENCY * 1000:.0f} ms before its first token")
    for label, values in (
        ("enqueue-to-done minus the model call", totals),
        ("  before the run starts (dequeue, fork)", waits),
        ("  the job's own time above its model call", overheads),
    ):
        print(f"  {label:42} p50 {percentile(values, 50):7.0f} ms  p95 {percentile(values, 95):7.0f} ms")


def _finished_run(target: str) -> JobRun:
    while True:
        db.session.rollback()
        run = db.session.scalar(
            sa.select(JobRun).where(
                JobRun.job_type == "reply", JobRun.target == target, JobRun.status == "done"
            )
        )
        if run is not None:
            return run
        time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replies", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        socket = Path(tmp) / "redis.sock"
        llm = FakeLLM()
        llm.delay, llm.chunk_delay = MODEL_LATENCY, 0.0
        env = {
            **os.environ,
            "DATABASE_URL": database_url("cairn_bench_overhead"),
            "REDIS_URL": f"unix://{socket}",
            "LLM_BASE_URL": llm.base_url,
            "SECRET_KEY": "bench",
            "INSTANCE_PATH": tmp,
        }
        processes = [subprocess.Popen(redis_server_argv(socket, tmp))]
        try:
            _wait(lambda: socket.exists() and Redis(unix_socket_path=str(socket)).ping(), "redis-server")
            app = _migrated_app(env)
            with app.app_context():
                components(app)
                log = open(Path(tmp) / "worker.log", "w")  # noqa: SIM115 (closed with the directory)
                worker = [sys.executable, "worker.py"]
                processes.append(subprocess.Popen(worker, cwd=ROOT, env=env, stdout=log, stderr=log))
                [(_, chat_id)] = seed_users(1, "overhead")
                replies(chat_id, args.replies)
                db.session.remove()
                db.engine.dispose()
        finally:
            for process in reversed(processes):
                process.terminate()
                process.wait(20)
            llm.close()


if __name__ == "__main__":
    main()
