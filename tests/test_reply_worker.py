"""A reply never waits for background memory work (issue 11, item 4): a replies-only worker
(`python worker.py --replies-only`) answers a chat while every general worker is busy with a long consolidation."""

import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import time_machine
from rq import Worker

from tests import factories
from tests.conftest import wait_for, worker_env
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.queue import enqueue, redis_connection
from webapp.models import JobRun, Message
from webapp.timeutil import utcnow

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
SLOW_MODEL_SECONDS = 90  # a consolidation's model call: far longer than a reply may wait (under the timeout)


@pytest.fixture
def start_worker(live_app, summaries_on_their_own_model):
    """Starts `python worker.py [flags]` processes, each in a session of its own, killed when the test ends."""
    started: list[subprocess.Popen] = []

    def start(*flags: str) -> subprocess.Popen:
        count = Worker.count(connection=redis_connection())
        worker = subprocess.Popen(
            [sys.executable, "worker.py", *flags], cwd=ROOT, env=worker_env(live_app), start_new_session=True
        )
        started.append(worker)
        wait_for(lambda: Worker.count(connection=redis_connection()) > count, 60, "the worker to start")
        return worker

    yield start
    for worker in started:  # one may be in the middle of a slow model call: no warm shutdown
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)


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


def test_a_reply_is_answered_while_the_general_worker_is_busy_consolidating(live_app, start_worker, fake_llm):
    admin = factories.user(factories.account())
    consolidations = []
    for name in ("Ada", "Basil"):
        agent, chat = _stale_chat(admin, name)
        memory = json.dumps({"journal": [f"{name}: tulips in March"], "core": []})
        fake_llm.reply(memory, model=agent.model_id, delay=SLOW_MODEL_SECONDS)
        consolidations.append(enqueue(consolidate_chat, chat.id))
    db.session.commit()
    start_worker()  # serves replies, then background work
    start_worker("--replies-only")
    wait_for(lambda: len(fake_llm.requests) == 1, 60, "a consolidation to reach the model")
    assert _statuses(consolidations) == ["queued", "running"]  # only the general worker takes them

    cleo = factories.agent(admin.account, "Cleo")
    chat = factories.chat(admin.account, [cleo])
    fake_llm.reply("The tulips go in in March.", model=cleo.model_id)
    client = live_app.test_client()
    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    assert (
        client.post(f"/chats/{chat.id}/messages", data={"content": "When do the tulips go in?"}).status_code
        == 200
    )
    [reply] = db.session.scalars(
        sa.select(Message).where(Message.chat_id == chat.id, Message.role == "assistant")
    )

    def answered() -> bool:
        db.session.expire_all()
        return db.session.get(Message, reply.id).status == "done"

    wait_for(answered, 30, "the reply")  # far sooner than the consolidation's model answers
    assert db.session.get(Message, reply.id).content == "The tulips go in in March."
    assert _statuses(consolidations) == ["queued", "running"]  # the background work still waits
