"""Where a reply job's time goes above its model call, with a real worker (`python worker.py`), redis-server
and database, and a model that answers after MODEL_LATENCY.

    .venv/bin/python -m bench.job_overhead [--replies 30]    # PostgreSQL (BENCH_DATABASE_URL or the local cluster)

Printed: what a worker could pay per job (a fork of the loaded worker, a fresh database connection, the app
context, tiktoken's encoder loaded cold in a new process), then for replies sent one after another (each
enqueued once the previous one is done): enqueue-to-done minus the model call, split into the wait before the
job's run starts (dequeue, and a fork when the worker forks) and the job's own time above its model call (what
bench.load reports as the reply job overhead; the model call is the reply's request, so the query's embedding
counts as the job's own work). Then where that own time goes, step by step, as the worker's stopwatch
(bench.timed_worker) saw it, with the SQL statements of the job's thread and the time they took.

By default a message's embedding runs beside its reply in the same worker, as when people write; --alone asks
each reply once that and the previous reply's background work are done. The agent is new (no memory, so its
prompt has nothing to rank and skips the search) unless --memories gives it some; --server-tools N enables N tools
of a tool server on it, which the model never calls (what offering them costs). The host's speed drifts: compare two
commits by running them alternately in one session, never with figures from another day.
"""

import argparse
import json
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
from webapp import tokens, tool_servers
from webapp.extensions import db
from webapp.jobs.replies import request_replies
from webapp.models import AgentMemory, Chat, JobRun, LlmCall, Message, ToolServer
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


def replies(chat_id: int, count: int, timings: Path, *, alone: bool, statements: bool) -> None:
    waits, overheads, totals, runs = [], [], [], []
    for _ in range(count + 1):  # the first one warms the worker up and is not counted
        chat = db.session.get(Chat, chat_id)
        chat.add_message(role="user", content="How are you?", status="done")
        if alone:  # the message's embedding, and what the last reply queued, done before the reply is asked
            db.session.commit()
            _settle()
            chat = db.session.get(Chat, chat_id)
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
        own = (run.finished_at - run.started_at).total_seconds() * 1000 - _model_ms(run.id)
        totals.append(total - _model_ms(run.id))
        overheads.append(own)
        waits.append(total - _model_ms(run.id) - own)
        runs.append(run.id)
    totals, waits, overheads, runs = totals[1:], waits[1:], overheads[1:], runs[1:]
    print(f"\n{count} replies one after another, model {MODEL_LATENCY * 1000:.0f} ms before its first token")
    for label, values in (
        ("enqueue-to-done minus the model call", totals),
        ("  before the run starts (dequeue, fork)", waits),
        ("  the job's own time above its model call", overheads),
    ):
        _line(label, values)
    _split(runs, timings, statements)


TOPICS = ["garden", "piano", "bicycle", "recipe", "holiday", "budget", "allergy", "project", "sister", "dog"]


def _remember(chat_id: int, count: int) -> None:
    """Give the chat's agent `count` core memories, embedded before the first reply is asked (--memories)."""
    if not count:
        return
    agent = db.session.get(Chat, chat_id).agents[0]
    for n in range(count):
        topic = TOPICS[n % len(TOPICS)]
        content = f"Note {n} about the {topic}: the person mentioned their {topic} on day {n % 28 + 1}."
        db.session.add(AgentMemory(agent_id=agent.id, content=content, memory_type="core"))
    db.session.commit()
    _settle()
    print(f"\nthe agent has {count} core memories, which each prompt ranks")


def _with_server_tools(chat_id: int, count: int) -> None:
    """Enable `count` tools of a tool server (tests/mcp_tool_server.py over stdio) on the chat's agent, which the
    model never calls (--server-tools): what offering them costs a reply."""
    if not count:
        return
    agent = db.session.get(Chat, chat_id).agents[0]
    server = ToolServer(
        account_id=agent.account_id,
        name="bench",
        kind="stdio",
        command=sys.executable,
        arguments=[str(ROOT / "tests" / "mcp_tool_server.py"), "stdio"],
    )
    db.session.add(server)
    db.session.flush()
    if problem := tool_servers.refresh(server):
        raise SystemExit(f"The bench's tool server did not list its tools: {problem}")
    names = [tool["offered_name"] for tool in server.usable_tools if tool["name"] != "hang"][:count]
    agent.enabled_tools = [*agent.enabled_tools, *names]
    db.session.commit()
    print(f"\nthe agent has {len(names)} tools of a tool server enabled, which the model never calls")


def _model_ms(run_id: int) -> float:
    """The reply's model calls (not the query's embedding, which is part of the job's own work)."""
    return db.session.scalar(
        sa.select(sa.func.sum(LlmCall.latency_ms)).where(
            LlmCall.job_run_id == run_id, LlmCall.purpose == "reply"
        )
    )


def _settle() -> None:
    """Wait until the background jobs queued so far (embeddings, a summary) are done (--alone)."""
    while True:
        db.session.rollback()
        busy = db.session.scalar(
            sa.select(sa.func.count()).where(
                JobRun.job_type != "reply", JobRun.status.in_(("queued", "running"))
            )
        )
        if not busy:
            return
        time.sleep(0.005)


def _split(runs: list[int], timings: Path, statements: bool) -> None:
    """Where the job's own time goes, step by step (bench.timed_worker's stopwatch in the worker)."""
    while True:  # the worker writes a run's line once its job returns, just after the run is marked done
        lines = [json.loads(line) for line in timings.read_text().splitlines()]
        by_run = {line["run_id"]: line for line in lines if line["run_id"] in runs}
        if len(by_run) == len(runs):
            break
        time.sleep(0.05)
    steps = [by_run[run_id]["steps"] for run_id in runs]
    for run_id, step in zip(runs, steps, strict=True):
        step["run"] -= _model_ms(run_id) + step.pop("after the run", 0.0)
        step["tool loop above its model call"] = step.pop("tool loop", 0.0) - _model_ms(run_id)
        named = sum(step.get(label, 0.0) for label, _depth in SPLIT[1:] if _depth == 1)
        step["the rest"] = step["run"] - named
    print("\n  the job's own time, step by step (bench.timed_worker; a step's lines below it are part of it)")
    for label, depth in SPLIT:
        _line("  " * depth + ("own time" if label == "run" else label), [s.get(label, 0.0) for s in steps])
    _line("  SQL statements of the job's own thread", [len(by_run[r]["sql"]) for r in runs], unit="")
    _line("    the time they took", [by_run[r]["sql_ms"] for r in runs])
    if statements:
        print("\n  the SQL statements of the last reply, in order")
        print("\n".join(f"    {line}" for line in by_run[runs[-1]]["sql"]))


# The steps printed, with their depth: each step's time includes that of the deeper ones listed after it.
SPLIT = [
    ("run", 0),
    ("prompt", 1),
    ("recent messages", 2),
    ("access rule (a chat's people)", 2),
    ("relevant memories", 2),
    ("any vectors?", 3),
    ("query embedding (own thread)", 3),
    ("the vector", 4),  # its ledger row is set aside until the prompt is built (ledger.write_aside)
    ("fused search", 3),
    ("by words", 4),
    ("memories within budget", 2),
    ("memory section", 2),
    ("other conversations", 2),
    ("fit to budget (tokens)", 2),
    ("tool loop above its model call", 1),
    ("record sources", 1),
    ("after success (enqueues)", 1),
    ("close run", 1),
    ("commits between them", 1),
    ("events published between them", 1),
    ("stop flag read between them", 1),
    ("Redis locks taken between them", 1),
    ("the rest", 1),
]


def _line(label: str, values: list[float], unit: str = " ms") -> None:
    print(f"  {label:52} p50 {percentile(values, 50):7.1f}{unit:3}  p95 {percentile(values, 95):7.1f}{unit}")


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
    parser.add_argument(
        "--alone",
        action="store_true",
        help="ask each reply once the background work queued before it is done, its message's embedding "
        "included (by default that embedding runs beside the reply, in the same worker, as when people write)",
    )
    parser.add_argument(
        "--memories",
        type=int,
        default=0,
        help="give the agent this many core memories first, so each prompt ranks them (a new agent has none, "
        "and its prompt skips the search)",
    )
    parser.add_argument(
        "--server-tools",
        type=int,
        default=0,
        help="enable this many tools of a tool server (MCP, over stdio) on the agent, never called",
    )
    parser.add_argument(
        "--statements", action="store_true", help="print the SQL statements of the last reply"
    )
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
                timings = Path(tmp) / "timings.jsonl"
                worker = [sys.executable, "-m", "bench.timed_worker"]
                worker_env = {**env, "BENCH_TIMINGS": str(timings)}
                processes.append(subprocess.Popen(worker, cwd=ROOT, env=worker_env, stdout=log, stderr=log))
                [(_, chat_id)] = seed_users(1, "overhead")
                _remember(chat_id, args.memories)
                _with_server_tools(chat_id, args.server_tools)
                replies(chat_id, args.replies, timings, alone=args.alone, statements=args.statements)
                db.session.remove()
                db.engine.dispose()
        finally:
            for process in reversed(processes):
                process.terminate()
                process.wait(20)
            llm.close()


if __name__ == "__main__":
    main()
