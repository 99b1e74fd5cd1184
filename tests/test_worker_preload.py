"""The worker loads what every job needs once, before RQ forks a work horse per job (11.4): a forked horse
finds the tokenizer, the job functions and the prompt templates already in memory."""

import os

import worker
from webapp import prompting, tokens
from webapp.jobs.queue import JOB_TYPES


def test_preload_leaves_nothing_expensive_for_the_work_horse(app):
    tokens.encoder.cache_clear()

    worker.preload(app)

    pid = os.fork()
    if pid == 0:  # the work horse: it must not have to load the tokenizer again
        os._exit(0 if tokens.encoder.cache_info().currsize == 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert {"reply", "consolidate", "summarize"} <= set(JOB_TYPES)
    assert len(prompting._env.cache) >= 5  # every prompt template parsed
