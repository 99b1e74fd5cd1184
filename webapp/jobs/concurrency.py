"""Running a job's independent parts at the same time, each in its own app context and database session."""

import contextvars
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from flask import Flask, current_app

from webapp.extensions import db

T = TypeVar("T")
R = TypeVar("R")

_given_up: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar("given_up", default=None)


def map_in_threads(func: Callable[[T], R], items: Iterable[T], max_workers: int) -> list[R]:
    """func(item) for every item, at most max_workers at once; results in the order of items.

    When the caller stops waiting (a part failed, or RQ stopped the job at its time limit), the parts not
    started are dropped and the running ones see cancelled() and stop at their next step."""
    app = current_app._get_current_object()
    items = list(items)
    if not items:
        return []
    given_up = threading.Event()
    token = _given_up.set(given_up)
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items)))) as pool:
            # Each task gets a copy of this context: it knows the job run its model calls belong to, and
            # whether its caller gave up.
            futures = [
                pool.submit(contextvars.copy_context().run, _in_app_context, app, func, item)
                for item in items
            ]
            try:
                return [future.result() for future in futures]
            except BaseException:
                given_up.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    finally:
        _given_up.reset(token)


def cancelled() -> bool:
    """In a part run by map_in_threads: whether its caller gave up, so the part should stop now."""
    given_up = _given_up.get()
    return given_up is not None and given_up.is_set()


def _in_app_context(app: Flask, func: Callable[[T], R], item: T) -> R:
    with app.app_context():
        try:
            return func(item)
        finally:
            db.session.remove()
