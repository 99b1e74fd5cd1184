"""Running a job's independent parts at the same time, each in its own app context and database session."""

import contextvars
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from flask import Flask, current_app

from webapp.extensions import db

T = TypeVar("T")
R = TypeVar("R")


def map_in_threads(func: Callable[[T], R], items: Iterable[T], max_workers: int) -> list[R]:
    """func(item) for every item, at most max_workers at once; results in the order of items."""
    app = current_app._get_current_object()
    items = list(items)
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(items)))) as pool:
        # Each task gets a copy of this context, so it knows the job run its model calls belong to.
        futures = [
            pool.submit(contextvars.copy_context().run, _in_app_context, app, func, item) for item in items
        ]
        return [future.result() for future in futures]


def _in_app_context(app: Flask, func: Callable[[T], R], item: T) -> R:
    with app.app_context():
        try:
            return func(item)
        finally:
            db.session.remove()
