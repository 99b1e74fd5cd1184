"""Jobs used only by the queue tests (RQ imports them by dotted path in the worker)."""

import os
import time

from webapp.jobs.queue import recorded_job
from webapp.llm import LLMError


@recorded_job("sample", "Sample", target=lambda n: f"n:{n}")
def counts(n: int) -> dict:
    return {"items": n}


@recorded_job("sample_fails", "Sample fails")
def fails_for_good() -> None:
    raise ValueError("bad input that no retry fixes")


@recorded_job("sample_model_down", "Sample model down")
def model_is_down() -> None:
    raise LLMError("The model returned HTTP 503: busy", retryable=True)


@recorded_job("sample_pid", "Sample pid")
def process_id() -> dict:
    return {"pid": os.getpid()}


@recorded_job("sample_sleeps", "Sample sleeps", timeout=lambda seconds: 1)
def sleeps(seconds: float) -> dict:
    time.sleep(seconds)
    return {"slept": seconds}
