"""Replies first: a worker's background work steps aside while a reply of the same process builds its prompt.

A reply's prompt is work on the path of someone waiting (its query's embedding, the fused search, the memory
that fits); a message's embedding, queued at the same moment as the reply to it, ran beside it on the same cores
and about doubled the reply job's own time (bench.job_overhead). So a background job calls `after_replies()`
before each heavy step: it returns at once when no reply of this process is building its prompt, else once
none is, or after MAX_WAIT_SECONDS (replies that follow each other never hold background work back for long).
The model call is not covered: background work runs while a reply waits for its model.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

MAX_WAIT_SECONDS = 2.0

_building = 0
_changed = threading.Condition()


@contextmanager
def reply_building() -> Iterator[None]:
    """Around a reply's work before its model call: background work of this process waits meanwhile."""
    global _building
    with _changed:
        _building += 1
    try:
        yield
    finally:
        with _changed:
            _building -= 1
            _changed.notify_all()


def after_replies(max_wait: float = MAX_WAIT_SECONDS) -> None:
    """Return once no reply of this process is building its prompt, or after `max_wait` seconds."""
    with _changed:
        _changed.wait_for(lambda: _building == 0, timeout=max_wait)
