"""Jobs plumbing: enqueue after commit, Retry for retryable errors, every run recorded in job_runs."""

from datetime import timedelta

import pytest
import sqlalchemy as sa
from rq import SimpleWorker
from rq.job import JobStatus

from tests import sample_jobs
from webapp.extensions import db
from webapp.jobs.queue import (
    HEARTBEAT_SECONDS,
    LOCK_SECONDS,
    enqueue,
    held_lock,
    lock_holder,
    rq_queue,
    worker_queues,
)
from webapp.jobs.sweep import sweep
from webapp.models import Account, JobRun


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
    # The retry waiting for its backoff is a queued row: it survives Redis losing the scheduled job.
    assert [(r.status, r.rq_job_id) for r in _runs()] == [
        ("failed", down.id),
        ("failed", bad.id),
        ("queued", down.id),
    ]
    assert "HTTP 503" in _runs()[0].error


# The database is the record of work to do; the sweep puts lost work back (issue 11, items 1 and 2)


def _later(seconds: float):
    import time_machine

    from webapp.timeutil import utcnow

    return time_machine.travel(utcnow() + timedelta(seconds=seconds), tick=False)


def test_a_job_that_could_not_be_queued_is_queued_by_the_sweep_once(app, fake_redis):
    from redis import Redis

    app.extensions["redis"] = Redis(unix_socket_path="/nonexistent/redis.sock")  # Redis is down
    # The clock stands still until the first sweep: the failed queueing alone retries for over 3 s, and on a busy
    # machine the run was past its grace by then.
    with _later(0):
        enqueue(sample_jobs.counts, 3)
        db.session.commit()  # the commit succeeds; queueing fails quietly
        app.extensions["redis"] = fake_redis
        [run] = _runs()
        assert (run.status, rq_queue().count) == ("queued", 0)

        assert sweep() == {"interrupted": 0, "requeued": 0}  # too young: may still be on its way
    with _later(6):
        assert sweep() == {"interrupted": 0, "requeued": 1}
        assert sweep() == {"interrupted": 0, "requeued": 0}  # never two jobs for one run
    [job] = rq_queue().get_jobs()
    assert job.id == run.rq_job_id

    _work(app)
    assert [(r.status, r.counts) for r in _runs()] == [("done", {"items": 3})]


def test_a_job_lost_with_redis_data_is_queued_again(app, fake_redis):
    enqueue(sample_jobs.counts, 4)
    db.session.commit()
    fake_redis.flushall()  # Redis restarted without persistence

    with _later(6):
        assert sweep()["requeued"] == 1
    _work(app)
    assert [r.status for r in _runs()] == ["done"]


def test_a_run_whose_worker_died_is_closed_as_interrupted_and_queued_again(app, fake_redis):
    enqueue(sample_jobs.counts, 5)
    db.session.commit()
    [run] = _runs()
    run.status = "running"  # what a worker killed mid-run leaves: its lock expired with it
    db.session.commit()

    assert sweep()["interrupted"] == 0  # first seen unlocked: a live holder would re-take its lock
    with _later(2 * HEARTBEAT_SECONDS + 1):
        assert sweep()["interrupted"] == 1

    dead, again = _runs()
    assert (dead.status, again.status, again.args) == ("interrupted", "queued", [5])
    assert dead.error.startswith("Interrupted: the worker running this job stopped")
    [job] = rq_queue().get_jobs()
    assert job.id == again.rq_job_id


def test_a_running_job_keeps_its_lock_so_the_sweep_leaves_it_alone(app):
    enqueue(sample_jobs.counts, 6)
    db.session.commit()
    [run] = _runs()
    with held_lock(f"run:sample:{run.target}", token=str(run.id)):
        run.status = "running"
        db.session.commit()
        with _later(60):
            assert sweep() == {"interrupted": 0, "requeued": 0}
            assert sweep() == {"interrupted": 0, "requeued": 0}


def test_a_lock_is_renewed_while_held_and_free_after(app, fake_redis):
    import time

    with held_lock("thing") as mine:
        assert mine
        with held_lock("thing") as second:
            assert not second  # one holder at a time
        time.sleep(HEARTBEAT_SECONDS + 0.5)
        assert fake_redis.pttl("cairn:lock:thing") > (LOCK_SECONDS - HEARTBEAT_SECONDS) * 1000
    assert lock_holder("thing") is None


def test_a_second_run_of_the_same_target_skips_while_the_first_holds_its_lock(app):
    with held_lock("run:sample:n:7"):
        assert sample_jobs.counts(7) == {"skipped": "another run of this target is running"}


def test_replies_have_their_own_queue_served_before_background_work(app, fake_llm, admin):
    from tests import factories
    from webapp.jobs.replies import request_replies

    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    enqueue(sample_jobs.counts, 1)  # background work queued first
    db.session.commit()
    request_replies(chat, [ada])
    db.session.commit()
    assert (rq_queue("replies").count, rq_queue().count) == (1, 1)

    SimpleWorker(worker_queues(), connection=app.extensions["redis"]).work(burst=True)

    finished = sorted(_runs(), key=lambda r: r.finished_at)
    assert [r.job_type for r in finished if r.job_type in ("reply", "sample")] == ["reply", "sample"]


# Each job kind runs under a time limit that fits it, not RQ's default of 180 seconds for all


def test_each_job_gets_a_time_limit_that_fits_its_model_calls(app, admin):
    from tests import factories
    from webapp.jobs import schedule
    from webapp.jobs.consolidation import consolidate_chat
    from webapp.jobs.ping import ping
    from webapp.jobs.refinement import refine_agent
    from webapp.jobs.replies import request_replies
    from webapp.jobs.runs import NO_MODEL_SECONDS
    from webapp.jobs.summaries import summarize

    app.config.update(LLM_TIMEOUT_SECONDS=120, REPLY_MAX_TOOL_TURNS=5, REFINEMENT_MAX_TURNS=12)
    ada, basil = factories.agent(admin.account, "Ada"), factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil])
    [one] = request_replies(chat, [ada])
    both = request_replies(chat, [ada, basil])
    for func, args in [
        (consolidate_chat, (chat.id,)),
        (summarize, (chat.id, ada.id)),
        (refine_agent, (ada.id,)),
    ]:
        enqueue(func, *args)
    enqueue(ping)
    db.session.commit()
    limit = {
        (run.job_type, tuple(run.args[0]) if run.job_type == "reply" else None): rq_queue(
            "replies" if run.job_type == "reply" else "background"
        )
        .fetch_job(run.rq_job_id)
        .timeout
        for run in _runs()
    }
    reply_one, reply_both = limit[("reply", (one.id,))], limit[("reply", tuple(m.id for m in both))]

    assert 5 * 120 <= reply_one < 2 * 5 * 120 <= reply_both  # every turn of each agent's tool loop
    assert 120 <= limit[("summarize", None)] < reply_one  # one request
    assert limit[("refine", None)] >= 12 * 120  # every turn of a refinement session
    assert limit[("consolidate", None)] >= 3600  # many 100k-token chunks: an hour at the default timeout
    assert limit[("ping", None)] == NO_MODEL_SECONDS

    app.config["LLM_TIMEOUT_SECONDS"] = 300  # a slower model: longer limits
    [slow] = request_replies(chat, [ada])
    db.session.commit()
    assert rq_queue("replies").fetch_job(_runs()[-1].rq_job_id).timeout >= 5 * 300

    schedule.sync()  # the finders, started by rq-scheduler, ask no model
    assert {job.timeout for job in schedule.scheduler().get_jobs()} == {NO_MODEL_SECONDS}


def test_a_job_stopped_at_its_time_limit_fails_with_a_clear_reason_and_is_not_retried(app):
    enqueue(sample_jobs.sleeps, 5)
    db.session.commit()
    [job] = rq_queue().get_jobs()

    _work(app)

    [run] = _runs()
    assert (run.status, run.error) == (
        "failed",
        "Timed out: the job ran past its time limit of 1 seconds and was stopped.",
    )
    job.refresh()
    assert job.get_status() == JobStatus.FAILED  # and no queued row for another attempt


def test_parts_running_in_threads_stop_when_their_job_gives_up(app):
    import threading
    import time

    from webapp.jobs.concurrency import cancelled, map_in_threads

    started, saw_cancel = threading.Event(), []

    def part(n: int) -> int:
        if n == 0:
            started.wait(10)
            raise RuntimeError("stopped at its time limit")
        started.set()
        for _ in range(1000):  # one step per model request, until told to stop
            if cancelled():
                saw_cancel.append(n)
                return n
            time.sleep(0.01)
        return n

    with pytest.raises(RuntimeError):
        map_in_threads(part, [0, 1], max_workers=2)

    assert saw_cancel == [1]
    assert not cancelled()  # outside the parts, nothing is cancelled


# One job per target, even when two transactions enqueue it at the same moment


def test_two_transactions_queueing_the_same_unique_job_at_once_queue_it_once(app, admin):
    import threading

    from tests import factories
    from webapp.jobs.summaries import summarize

    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    chat_id, agent_id = chat.id, ada.id
    assert (
        enqueue(summarize, chat_id, agent_id) is not None
    )  # the first post's transaction: not committed yet
    db.session.flush()
    second_writes, second_result = threading.Event(), []

    def signal_its_write(conn, cursor, statement, *args):
        if threading.current_thread().name == "second" and statement.lstrip().upper().startswith(
            ("INSERT", "UPDATE")
        ):
            second_writes.set()

    def second_post() -> None:  # another request, in its own session, between the first's check and commit
        with app.app_context():
            try:
                second_result.append(enqueue(summarize, chat_id, agent_id))
                db.session.commit()
            finally:
                second_writes.set()
                db.session.remove()

    sa.event.listen(db.engine, "before_cursor_execute", signal_its_write)
    try:
        second = threading.Thread(target=second_post, name="second")
        second.start()
        assert second_writes.wait(
            30
        )  # the second is about to write (SQLite: it waits for the first) or is done
        db.session.commit()
        second.join(30)
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", signal_its_write)

    assert second_result == [None]
    assert [(r.job_type, r.status) for r in _runs()] == [("summarize", "queued")]
    assert len(rq_queue().get_jobs()) == 1
