"""The cost ledger's rows (llm_calls): one per model request, written on a connection of its own so it survives
whatever the caller's session does; held for the end of a request that holds the process's one connection, or
of a block that hands a call's result over first (rows_at_end), for the ledger's thread to write once no reply
of the process is building its prompt."""

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import sqlalchemy as sa
from flask import Flask, current_app

from webapp.extensions import db
from webapp.models import LlmCall
from webapp.models.runs import current_job_run_id
from webapp.runtime import priority
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)

# With one database connection in the process (SQLite under gevent: webapp.config.engine_options), a request holds
# it until it ends, so a ledger row cannot be written on a connection of its own meanwhile (the chat's memory page
# waited 30 s for one, to embed its query). The request's rows are held, and written once it let the connection go.
_held_rows: ContextVar[list[dict[str, Any]] | None] = ContextVar("held_ledger_rows", default=None)


def hold_rows() -> None:
    """Before a request of a process with one connection: its rows wait for its end."""
    _held_rows.set([])


def write_held_rows(_error: BaseException | None) -> None:
    """At the end of such a request, once it let the connection go."""
    rows = _held_rows.get()
    _held_rows.set(None)
    if rows:
        db.session.remove()  # gives the connection back
        _write_rows(rows)


@contextmanager
def rows_at_end() -> Iterator[None]:
    """The ledger rows recorded inside are set aside as it ends, for the ledger's thread to write in one
    statement (write_aside): so what the calls gave may be handed over first (a query's embedding, to the search
    waiting for it). Held already for a request, they stay held for its end."""
    if _held_rows.get() is not None:
        yield
        return
    held = _held_rows.set([])
    try:
        yield
    finally:
        rows = _held_rows.get()
        _held_rows.reset(held)
        if rows:
            write_aside(rows)


# Rows set aside, and the one thread that writes them (a drain is queued when the first row arrives).
_aside: list[dict[str, Any]] = []
_aside_lock = threading.Lock()
_aside_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-aside")


def write_aside(rows: list[dict[str, Any]]) -> None:
    """Have the ledger's thread write the rows once no reply of this process is building its prompt
    (webapp.runtime.priority), so that they are written while its model thinks, not beside the prompt's
    statements. A query's embedding's row, written on the embedding's thread while the reply built its prompt
    and waited for before the search returned, made build_prompt 14.6 ms p50 against 13.2 so (200 memories on
    PostgreSQL, in-process, six rounds alternated). A row that cannot be written is logged, not raised: the
    reply it was for goes on."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    with _aside_lock:
        drain_queued = bool(_aside)
        _aside.extend(rows)
    if not drain_queued:
        _aside_writer.submit(_write_set_aside, app)


def _write_set_aside(app: Flask) -> None:
    priority.after_replies()
    with _aside_lock:
        rows = _aside[:]
        _aside.clear()
    try:
        with app.app_context():
            _write_rows(rows)
    except Exception:
        log.exception("%d cost-ledger rows could not be written", len(rows))


def wait_for_rows_aside(timeout: float | None = None) -> None:
    """Return once the rows set aside so far are written (or after `timeout` seconds): for tests and benches."""
    try:
        _aside_writer.submit(lambda: None).result(timeout)
    except TimeoutError:
        pass


def record_call(fields: dict[str, Any], started: float, **outcome: Any) -> None:
    """Write the ledger row on its own connection, so it survives whatever the caller's session does (where a
    request holds the process's one connection, once the request ends)."""
    row = {
        **fields,
        **outcome,
        "job_run_id": current_job_run_id.get(),
        "latency_ms": int((time.monotonic() - started) * 1000),
        "created_at": utcnow(),
    }
    if (held := _held_rows.get()) is not None:
        held.append(row)
        return
    _write_rows([row])


def _write_rows(rows: list[dict[str, Any]]) -> None:
    with db.engine.begin() as conn:
        conn.execute(sa.insert(LlmCall), rows)
