"""worker.py with a stopwatch on the steps of a reply job, for bench.job_overhead.

    BENCH_TIMINGS=/tmp/timings.jsonl .venv/bin/python -m bench.timed_worker [worker.py's options]

Each step below is timed wherever it runs (the query's embedding on a thread of its own, under the run's id);
once a reply run ends, one JSON line gives its id, each step's milliseconds, and the SQL statements the run's
own thread sent with the time they took. The steps are the module attributes the job calls, so the worker's
code is measured as it is, with nothing changed but the timers around them.
"""

import functools
import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from importlib import import_module
from typing import Any

import sqlalchemy as sa

import worker
from webapp.models.runs import current_job_run_id

# (module, attribute, label): what each step is called in the split bench.job_overhead prints
STEPS = [
    ("webapp.jobs.queue", "_execute", "run"),
    ("webapp.jobs.replies", "build_prompt", "prompt"),
    ("webapp.prompting.build", "_recent_messages", "recent messages"),
    ("webapp.models.access", "people_of", "access rule (a chat's people)"),
    ("webapp.prompting.build", "_relevant_memories", "relevant memories"),
    ("webapp.search", "vector_dimensions", "any vectors?"),
    ("webapp.search", "_embed", "query embedding (own thread)"),
    ("webapp.search.embedder", "embed", "the vector"),
    ("webapp.search", "memory_ids", "fused search"),
    ("webapp.search.signals.words", "_lexical", "by words"),
    ("webapp.prompting.build", "memories_within", "memories within budget"),
    ("webapp.prompting.build", "_memory_section", "memory section"),
    ("webapp.prompting.build", "other_conversation_summaries", "other conversations"),
    ("webapp.prompting.build", "fit_to_budget", "fit to budget (tokens)"),
    ("webapp.jobs.replies", "stream_tool_loop", "tool loop"),
    ("webapp.jobs.replies", "record_sources", "record sources"),
    ("webapp.jobs.replies", "_after_success", "after success (enqueues)"),
    ("webapp.jobs.replies", "_retried_meanwhile", "close run"),
    ("webapp.jobs.queue", "finish_run", "after the run"),  # its counts, once finished_at is written
    # Timed only between the steps above (outside any of them), so that none is counted twice.
    ("sqlalchemy.orm", "Session.commit", "commits between them"),
    ("webapp.events", "publish", "events published between them"),
    ("webapp.jobs.replies", "stop_requested", "stop flag read between them"),
    ("redis.lock", "Lock.acquire", "Redis locks taken between them"),
    ("redis.lock", "Lock.release", "Redis locks taken between them"),
]

_times: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
_sql: dict[int, list[tuple[float, str]]] = defaultdict(list)
_lock = threading.Lock()
_open = threading.local()  # the labels of the steps this thread is in, innermost last


def _timed(func: Callable[..., Any], label: str) -> Callable[..., Any]:
    @functools.wraps(func)
    def timed(*args: Any, **kwargs: Any) -> Any:
        stack = _open.__dict__.setdefault("labels", [])
        between = label.endswith("between them") and stack[-1:] == ["run"]
        stack.append(label)
        started = time.perf_counter()
        try:
            return func(*args, **kwargs)
        finally:
            stack.pop()
            run_id = args[0] if label == "run" else current_job_run_id.get()
            if run_id is not None and (between or not label.endswith("between them")):
                with _lock:
                    _times[run_id][label] += (time.perf_counter() - started) * 1000
                if label == "run":
                    _write(run_id)

    return timed


def _write(run_id: int) -> None:
    with _lock:
        steps, statements = _times.pop(run_id), _sql.pop(run_id, [])
    line = {
        "run_id": run_id,
        "steps": steps,
        "sql": [f"{ms:6.1f} ms  {' '.join(statement.split())[:160]}" for ms, statement in statements],
        "sql_ms": sum(ms for ms, _statement in statements),
    }
    with open(os.environ["BENCH_TIMINGS"], "a") as out:
        out.write(json.dumps(line) + "\n")


def _count_sql() -> None:
    started = threading.local()

    @sa.event.listens_for(sa.engine.Engine, "before_cursor_execute")
    def before(*_args: Any) -> None:
        started.at = time.perf_counter()

    @sa.event.listens_for(sa.engine.Engine, "after_cursor_execute")
    def after(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        run_id = current_job_run_id.get()
        if run_id is not None:
            with _lock:
                _sql[run_id].append(((time.perf_counter() - started.at) * 1000, statement))


def install() -> None:
    for module, path, label in STEPS:
        owner = import_module(module)
        *classes, attribute = path.split(".")
        for name in classes:
            owner = getattr(owner, name)
        setattr(owner, attribute, _timed(getattr(owner, attribute), label))
    _count_sql()


if __name__ == "__main__":
    install()
    worker.main([sys.argv[0], *sys.argv[1:]])
