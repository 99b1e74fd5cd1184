"""bench.job_overhead times a reply's steps by the names of the functions the job calls: a step renamed or moved
must be renamed there too, or the bench's worker stops at its start."""

from importlib import import_module

import pytest

from bench.timed_worker import STEPS


@pytest.mark.parametrize(("module", "path", "label"), STEPS, ids=[label for _, _, label in STEPS])
def test_each_step_the_reply_bench_times_is_a_function_the_job_calls(module, path, label):
    owner = import_module(module)
    for name in path.split("."):
        owner = getattr(owner, name)

    assert callable(owner), label
