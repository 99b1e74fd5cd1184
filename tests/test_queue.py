"""Jobs plumbing: enqueue after commit, Retry for retryable errors, every run recorded in job_runs."""

import pytest
import sqlalchemy as sa
from rq import SimpleWorker
from rq.job import JobStatus

from tests import sample_jobs
from webapp.extensions import db
from webapp.models import Account, JobRun
from webapp.queue import enqueue, rq_queue


def _runs() -> list[JobRun]:
    db.session.expire_all()
    return list(db.session.scalars(sa.select(JobRun).order_by(JobRun.id)))


def _work(app) -> None:
    SimpleWorker([rq_queue()], connection=app.extensions["redis"]).work(burst=True)


def test_a_job_is_enqueued_only_when_the_transaction_commits(app):
    enqueue(sample_jobs.counts, 3)
    assert rq_queue().count == 0

    db.session.add(Account(name="x"))
    db.session.commit()

    [job] = rq_queue().get_jobs()
    assert job.func_name == "tests.sample_jobs.counts"
    assert job.args == (3,)
    assert job.retries_left == app.config["JOB_MAX_RETRIES"]


def test_a_rolled_back_transaction_enqueues_nothing(app):
    db.session.add(Account(name="x"))
    enqueue(sample_jobs.counts, 3)
    db.session.rollback()
    db.session.commit()

    assert rq_queue().count == 0


def test_a_run_is_recorded_with_target_status_timings_and_counts(app):
    assert sample_jobs.counts(7) == {"items": 7}

    [run] = _runs()
    assert (run.job_type, run.target, run.status, run.counts, run.args) == (
        "sample",
        "n:7",
        "done",
        {"items": 7},
        [7],
    )
    assert run.finished_at >= run.started_at
    assert run.error is None


def test_a_failed_run_keeps_its_reason(app):
    with pytest.raises(ValueError):
        sample_jobs.fails_for_good()

    [run] = _runs()
    assert run.status == "failed"
    assert "ValueError: bad input that no retry fixes" in run.error


def test_the_worker_retries_a_retryable_error_and_not_other_errors(app):
    enqueue(sample_jobs.model_is_down)
    enqueue(sample_jobs.fails_for_good)
    db.session.commit()
    down, bad = rq_queue().get_jobs()

    _work(app)

    down.refresh()
    bad.refresh()
    assert down.get_status() == JobStatus.SCHEDULED  # waiting for its backoff interval
    assert down.retries_left == app.config["JOB_MAX_RETRIES"] - 1
    assert bad.get_status() == JobStatus.FAILED
    assert [r.status for r in _runs()] == ["failed", "failed"]
    assert "HTTP 503" in _runs()[0].error
