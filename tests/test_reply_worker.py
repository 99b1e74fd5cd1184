"""Replies never wait for one another or for background memory work (issue 11, item 4). A worker process runs
WORKER_THREADS jobs at once, replies on every thread and background work on one; a replies-only worker
(`python worker.py --replies-only`) answers a chat while every general worker is busy with a long consolidation.
Each with real `python worker.py` processes and redis-server."""

import json
import signal
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine
from rq import Worker
from rq.job import JobStatus

import worker
from tests import factories
from tests.conftest import wait_for
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.queue import enqueue, redis_connection, rq_queue, worker_queues
from webapp.jobs.replies import request_replies
from webapp.models import JobRun, LlmCall, Message
from webapp.timeutil import utcnow

pytestmark = pytest.mark.integration
SLOW_MODEL_SECONDS = 90  # a consolidation's model call: far longer than a reply may wait (under the timeout)


def _stale_chat(admin, name: str):
    """A group chat with a message from hours ago: due for consolidation."""
    agent = factories.agent(admin.account, name)
    chat = factories.chat(admin.account, [agent], manual=True)
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, f"{name}, remember that the tulips go in in March.", author=admin)
    return agent, chat


def _statuses(runs: list[JobRun]) -> list[str]:
    db.session.expire_all()
    return sorted(db.session.get(JobRun, run.id).status for run in runs)


def _signed_in(live_app, user):
    client = live_app.test_client()
    client.post("/login", data={"email": user.email, "password": factories.PASSWORD})
    return client


def _post(client, chat, content: str) -> Message:
    assert client.post(f"/chats/{chat.id}/messages", data={"content": content}).status_code == 200
    return db.session.scalars(
        sa.select(Message)
        .where(Message.chat_id == chat.id, Message.role == "assistant")
        .order_by(Message.id.desc())
    ).first()


def _fresh(message: Message) -> Message:
    db.session.expire_all()
    return db.session.get(Message, message.id)


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param([((), 1), (("--replies-only",), 1)], id="a general and a replies-only worker"),
        pytest.param([((), 3)], id="one worker of three threads"),
    ],
)
def test_a_reply_is_answered_while_background_work_holds_a_worker(live_app, start_worker, fake_llm, workers):
    admin = factories.user(factories.account())
    consolidations = []
    for name in ("Ada", "Basil"):
        agent, chat = _stale_chat(admin, name)
        memory = json.dumps({"journal": [f"{name}: tulips in March"], "core": []})
        fake_llm.reply(memory, model=agent.model_id, delay=SLOW_MODEL_SECONDS)
        consolidations.append(enqueue(consolidate_chat, chat.id))
    db.session.commit()
    for flags, threads in workers:
        start_worker(*flags, threads=threads)
    wait_for(lambda: len(fake_llm.requests) == 1, 60, "a consolidation to reach the model")
    assert _statuses(consolidations) == ["queued", "running"]  # background work: one thread takes it

    cleo = factories.agent(admin.account, "Cleo")
    fake_llm.reply("The tulips go in in March.", model=cleo.model_id)
    reply = _post(
        _signed_in(live_app, admin), factories.chat(admin.account, [cleo]), "When do the tulips go in?"
    )

    wait_for(
        lambda: _fresh(reply).status == "done", 30, "the reply"
    )  # far sooner than the consolidation's model
    assert _fresh(reply).content == "The tulips go in in March."
    assert _statuses(consolidations) == ["queued", "running"]  # the background work still waits


def test_one_worker_answers_several_chats_at_once(live_app, start_worker, fake_llm):
    admin = factories.user(factories.account())
    client = _signed_in(live_app, admin)
    replies = []
    for name in ("Ada", "Basil", "Cleo"):
        agent = factories.agent(admin.account, name)
        fake_llm.reply(f"{name} here.", model=agent.model_id, delay=2)
        replies.append(_post(client, factories.chat(admin.account, [agent]), f"Hello {name}"))

    start_worker(threads=3)

    wait_for(lambda: all(_fresh(r).status == "done" for r in replies), 60, "the replies")
    assert [_fresh(r).content for r in replies] == ["Ada here.", "Basil here.", "Cleo here."]
    assert fake_llm.max_in_flight == 3  # asked at the same time, not one after another


def test_sigterm_lets_a_reply_in_hand_finish_then_the_worker_leaves(live_app, start_worker, fake_llm):
    admin = factories.user(factories.account())
    ada = factories.agent(admin.account, "Ada")
    fake_llm.reply("Finished, all of it.", model=ada.model_id, delay=3)
    reply = _post(_signed_in(live_app, admin), factories.chat(admin.account, [ada]), "Hello")
    process = start_worker(threads=2)
    wait_for(lambda: fake_llm.in_flight == 1, 30, "the reply to reach the model")

    process.send_signal(signal.SIGTERM)

    assert process.wait(30) == 0  # the idle thread stopped at once, the busy one after its reply
    assert (_fresh(reply).status, _fresh(reply).content) == ("done", "Finished, all of it.")
    assert Worker.count(connection=redis_connection()) == 0  # both threads' workers said they left


def test_a_second_signal_stops_the_worker_at_once_and_its_reply_is_picked_up_again(
    live_app, start_worker, fake_llm
):
    admin = factories.user(factories.account())
    ada = factories.agent(admin.account, "Ada")
    fake_llm.reply("Too slow to wait for.", model=ada.model_id, delay=SLOW_MODEL_SECONDS)
    reply = _post(_signed_in(live_app, admin), factories.chat(admin.account, [ada]), "Hello")
    process = start_worker(threads=2)
    wait_for(lambda: fake_llm.in_flight == 1, 30, "the reply to reach the model")

    process.send_signal(signal.SIGTERM)
    wait_for(lambda: Worker.count(connection=redis_connection()) == 1, 30, "the idle thread to stop")
    process.send_signal(signal.SIGTERM)  # the busy thread's reply would take another minute and a half
    assert process.wait(30) != 0

    fake_llm.reply("Here after all.", model=ada.model_id)
    start_worker(threads=1)  # its sweep finds the cut run once its lock lapses, and queues the reply again
    wait_for(lambda: _fresh(reply).status == "done", 60, "the reply to be picked up again")
    assert _fresh(reply).content == "Here after all."
    # The reply commits its text before its run records itself done (and then queues its embedding).
    wait_for(lambda: _reply_runs() == ["interrupted", "done"], 10, "the second run to be recorded done")


def test_a_reply_on_a_worker_thread_is_stopped_at_its_time_limit(app, fake_llm, admin, monkeypatch):
    from webapp.jobs import queue

    # A limit of 5 seconds (one turn of a 5-second model timeout, no margin), well past what building the prompt
    # takes on a busy host; the model then goes silent.
    monkeypatch.setattr(queue, "JOB_MARGIN_SECONDS", 0)
    app.config.update(LLM_TIMEOUT_SECONDS=5, REPLY_MAX_TOOL_TURNS=1)
    ada = factories.agent(admin.account, "Ada")
    [reply] = request_replies(factories.chat(admin.account, [ada]), [ada])
    db.session.commit()
    [job] = rq_queue("replies").get_jobs()
    fake_llm.hang("Let me think", seconds=12)
    monkeypatch.setattr(worker.AppWorker, "app", app, raising=False)
    monkeypatch.setattr(worker.AppWorker, "stop", threading.Event(), raising=False)

    thread = threading.Thread(
        target=worker.serve, args=(worker_queues(),), kwargs={"burst": True, "with_scheduler": False}
    )
    thread.start()
    thread.join(30)

    assert not thread.is_alive()
    timed_out = "Timed out: the job ran past its time limit of 5 seconds and was stopped."
    assert (_fresh(reply).status, _fresh(reply).error) == ("failed", f"{timed_out} Retry to ask again.")
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    [call] = db.session.scalars(sa.select(LlmCall)).all()
    assert call.status == "error"


def _reply_runs() -> list[str]:
    db.session.rollback()  # read what the worker has committed since
    return list(
        db.session.scalars(sa.select(JobRun.status).where(JobRun.job_type == "reply").order_by(JobRun.id))
    )
