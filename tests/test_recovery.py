"""Nothing stranded, lost or duplicated: real redis-server, real workers, killed with SIGKILL mid-job."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import time_machine
from redis import Redis

from tests import factories
from tests.conftest import _database_for_test, _in_context, _settings, wait_for, worker_env
from webapp.extensions import db
from webapp.factory import create_app
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.queue import enqueue
from webapp.jobs.refinement import refine_agent
from webapp.models import AgentMemory, AuditLog, EmbeddingQueue, JobRun, LlmCall, Message
from webapp.runtime.processes import redis_server_argv
from webapp.timeutil import utcnow

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
RECOVERY_SECONDS = 60  # the bound, from a worker's death to its work done or closed


class RedisServer:
    """A redis-server without persistence that a test can stop and start again (empty, as after a crash)."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket, self.dir = tmp_path / "redis.sock", tmp_path
        self.url = f"unix://{self.socket}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(redis_server_argv(self.socket, self.dir))
        connection = Redis(unix_socket_path=str(self.socket))
        wait_for(lambda: self.socket.exists() and connection.ping(), what="redis-server")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self.socket.unlink(missing_ok=True)


class Workers:
    """Real `python worker.py` processes, each in a session of its own (its jobs run in it)."""

    def __init__(self, app, **env: str) -> None:
        self.env = {**worker_env(app), **env}
        self.started: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=ROOT, env=self.env, start_new_session=True
        )
        self.started.append(worker)
        return worker

    def kill(self, worker: subprocess.Popen) -> None:
        """kill -9 the worker, with the job it is running, and anything it started."""
        subprocess.run(["pkill", "-KILL", "-P", str(worker.pid)], check=False)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)

    def stop_all(self) -> None:
        for worker in self.started:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(20)
                except subprocess.TimeoutExpired:
                    self.kill(worker)


@pytest.fixture
def redis(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    yield server
    if server.process.poll() is None:
        server.stop()


@pytest.fixture
def app(migrated_database, tmp_path, redis, fake_llm):
    settings = _settings(_database_for_test(migrated_database, tmp_path), fake_llm.base_url)
    settings.update(REDIS_URL=redis.url, JOB_RETRY_SECONDS=[1, 1, 1])  # and the same for the workers, below
    yield from _in_context(create_app(settings))


@pytest.fixture
def workers(app):
    started = Workers(app, JOB_RETRY_SECONDS="1,1,1")
    yield started
    started.stop_all()


@pytest.fixture
def admin(app):
    return factories.user(factories.account())


def _fresh(model, row_id):
    db.session.expire_all()
    return db.session.get(model, row_id)


def _runs(job_type: str) -> list[JobRun]:
    db.session.expire_all()
    return list(db.session.scalars(sa.select(JobRun).where(JobRun.job_type == job_type).order_by(JobRun.id)))


def _signed_in(app, user):
    client = app.test_client()
    assert (
        client.post("/login", data={"email": user.email, "password": factories.PASSWORD}).status_code == 303
    )
    return client


def test_a_post_while_redis_is_down_is_answered_once_redis_is_back(app, redis, workers, admin, fake_llm):
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    client = _signed_in(app, admin)
    fake_llm.reply("Here I am.")
    redis.stop()

    response = client.post(f"/chats/{chat.id}/messages", data={"content": "Anyone there?"})

    assert response.status_code == 200 and "Ada is thinking" in response.text
    [reply] = db.session.scalars(sa.select(Message).where(Message.role == "assistant")).all()
    [queued] = _runs("reply")
    assert (reply.status, queued.status) == ("pending", "queued")  # recorded, waiting for Redis

    redis.start()  # back, and empty: the job was never queued
    workers.start()

    wait_for(lambda: _fresh(Message, reply.id).status == "done", RECOVERY_SECONDS, "the reply")
    assert _fresh(Message, reply.id).content == "Here I am."
    wait_for(lambda: [r.status for r in _runs("reply")] == ["done"], 10, "the run to finish")
    replies = db.session.scalars(sa.select(LlmCall).where(LlmCall.purpose == "reply")).all()
    assert len(replies) == 1  # answered once
    assert db.session.scalar(sa.select(sa.func.count()).where(Message.role == "assistant")) == 1


def test_a_worker_killed_mid_reply_is_replaced_and_the_reply_answered_once(app, workers, admin, fake_llm):
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    client = _signed_in(app, admin)
    fake_llm.reply("Too late.", delay=120)  # the first attempt never gets its answer
    fake_llm.reply("Here now.")
    first = workers.start()
    client.post(f"/chats/{chat.id}/messages", data={"content": "Are you there?"})
    [reply] = db.session.scalars(sa.select(Message).where(Message.role == "assistant")).all()
    wait_for(lambda: fake_llm.in_flight == 1, 30, "the reply to reach the model")

    workers.kill(first)
    killed_at = time.monotonic()
    workers.start()

    wait_for(lambda: _fresh(Message, reply.id).status == "done", RECOVERY_SECONDS, "the reply")
    assert time.monotonic() - killed_at < RECOVERY_SECONDS
    assert _fresh(Message, reply.id).content == "Here now."
    wait_for(lambda: [r.status for r in _runs("reply")] == ["interrupted", "done"], 10, "the runs")
    assert "worker running this job stopped" in _runs("reply")[0].error
    assert db.session.scalar(sa.select(sa.func.count()).where(Message.role == "assistant")) == 1


def _over_budget_agent(admin):
    agent = factories.agent(admin.account, "Ada", core_token_budget=10)
    kept = factories.memory(agent, "Dana's garden faces north and gets little sun.")
    doomed = factories.memory(agent, "Dana once mentioned a blue watering can.")
    return agent, kept, doomed


def test_a_worker_killed_mid_refinement_frees_the_agent_and_its_session_rolls_back(
    app, workers, admin, fake_llm
):
    agent, kept, doomed = _over_budget_agent(admin)
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "delete", "id": str(doomed.id)})])
    fake_llm.reply("never seen", delay=120)
    enqueue(refine_agent, agent.id, True)
    db.session.commit()
    first = workers.start()
    wait_for(lambda: len(fake_llm.requests) == 2, 30, "the session's second turn")
    assert _fresh(AgentMemory, doomed.id).deleted_at is not None  # the session changed memory

    workers.kill(first)
    killed_at = time.monotonic()
    workers.start()

    wait_for(lambda: _runs("refine")[0].status == "interrupted", RECOVERY_SECONDS, "the run to close")
    closing = wait_for(lambda: _closing(agent), RECOVERY_SECONDS, "the session to close")
    assert time.monotonic() - killed_at < RECOVERY_SECONDS
    assert [r.status for r in _runs("refine")] == ["interrupted"]  # a half-done session is not re-run
    assert closing.data["mutations"] == 1

    client = _signed_in(app, admin)
    page = client.get(f"/admin/agents/{agent.id}/sessions").text
    assert "interrupted" in page
    response = client.post(f"/admin/sessions/{closing.session_id}/rollback")
    assert response.status_code in (200, 303), response.text
    assert _fresh(AgentMemory, doomed.id).deleted_at is None  # restored exactly
    assert _fresh(AgentMemory, kept.id).content == "Dana's garden faces north and gets little sun."

    # The agent's refinement lock died with the worker: a new session runs at once.
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "nothing to do"})])
    enqueue(refine_agent, agent.id, True)
    db.session.commit()
    wait_for(lambda: _runs("refine")[-1].status == "done", 30, "the next session")
    assert "skipped" not in _runs("refine")[-1].counts


def _closing(agent) -> AuditLog | None:
    db.session.expire_all()
    return db.session.scalar(
        sa.select(AuditLog).where(
            AuditLog.agent_id == agent.id, AuditLog.action == "memory_refinement_interrupted"
        )
    )


def test_a_worker_killed_mid_consolidation_is_requeued_without_duplicates_or_losses(
    app, workers, admin, fake_llm
):
    agents = [factories.agent(admin.account, name) for name in ("Ada", "Basil", "Cleo")]
    chat = factories.chat(admin.account, agents)
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, "We agreed to plant tulips in March.", author=admin)
    app.config["CONSOLIDATION_CONCURRENCY"] = 3
    for agent in agents:
        extracted = json.dumps({"journal": [f"{agent.name}: tulips in March"], "core": []})
        fake_llm.reply(extracted, model=agent.model_id, delay=120 if agent.name == "Cleo" else 0)
    fake_llm.reply(json.dumps({"journal": ["Cleo: tulips in March"], "core": []}), model="cleo-model")
    enqueue(consolidate_chat, chat.id)
    db.session.commit()
    first = workers.start()
    wait_for(lambda: _memory_count() == 2, 30, "Ada's and Basil's memories")

    workers.kill(first)
    killed_at = time.monotonic()
    workers.start()

    wait_for(lambda: _runs("consolidate")[-1].status == "done", RECOVERY_SECONDS, "the consolidation")
    assert time.monotonic() - killed_at < RECOVERY_SECONDS
    assert [r.status for r in _runs("consolidate")] == ["interrupted", "done"]
    contents = sorted(db.session.scalars(sa.select(AgentMemory.content)))
    assert contents == ["Ada: tulips in March", "Basil: tulips in March", "Cleo: tulips in March"]
    assert _fresh(type(chat), chat.id).last_consolidated_message_id is not None


def test_a_worker_killed_mid_embedding_is_requeued_and_every_row_gets_its_vector_once(app, admin, fake_llm):
    """200 memories written at once; the worker embedding them is killed after its first batch committed."""
    embedder = {"EMBEDDING_BASE_URL": fake_llm.base_url, "EMBEDDING_MODEL": "fake-embedder"}
    workers = Workers(app, JOB_RETRY_SECONDS="1,1,1", **embedder)
    fake_llm.embedding_delay = 1.0  # a batch of 64 is one request
    agent = factories.agent(admin.account)
    db.session.add_all(
        AgentMemory(agent=agent, content=f"Fact {i}: the greenhouse needs water.", memory_type="journal")
        for i in range(200)
    )
    db.session.commit()  # queues 200 rows and one embedding run
    try:
        first = workers.start()
        wait_for(lambda: 0 < _vectors() < 200, 60, "the first batch of vectors")

        workers.kill(first)
        killed_at = time.monotonic()
        fake_llm.embedding_delay = 0.0
        workers.start()

        wait_for(lambda: _vectors() == 200 and _waiting() == 0, RECOVERY_SECONDS, "every vector")
    finally:
        workers.stop_all()
    assert time.monotonic() - killed_at < RECOVERY_SECONDS
    statuses = [r.status for r in _runs("embed_memories_and_messages")]
    assert statuses[0] == "interrupted" and statuses[-1] == "done"
    assert db.session.scalar(sa.text("SELECT count(DISTINCT memory_id) FROM memory_vectors")) == 200


def _vectors() -> int:
    db.session.rollback()
    if not sa.inspect(db.session.connection()).has_table("memory_vectors"):
        return 0
    return db.session.scalar(sa.text("SELECT count(*) FROM memory_vectors"))


def _waiting() -> int:
    db.session.rollback()
    return db.session.scalar(sa.select(sa.func.count()).select_from(EmbeddingQueue))


def _memory_count() -> int:
    db.session.expire_all()
    return db.session.scalar(sa.select(sa.func.count()).select_from(AgentMemory))


def test_cut_streams_and_html_bodies_are_retried_never_stored_as_replies(app, workers, admin, fake_llm):
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    client = _signed_in(app, admin)
    fake_llm.cut("alpha bravo charlie")
    fake_llm.html()
    fake_llm.reply("The whole answer.")
    workers.start()

    client.post(f"/chats/{chat.id}/messages", data={"content": "Tell me everything."})
    [reply] = db.session.scalars(sa.select(Message).where(Message.role == "assistant")).all()

    wait_for(lambda: _fresh(Message, reply.id).status == "done", RECOVERY_SECONDS, "the reply")
    assert _fresh(Message, reply.id).content == "The whole answer."
    calls = db.session.scalars(sa.select(LlmCall).where(LlmCall.purpose == "reply").order_by(LlmCall.id))
    assert [(c.status, (c.error or "")[:40]) for c in calls] == [
        ("error", "The model's answer was cut off: it ended"),
        ("error", "The model's server answered with somethi"),
        ("ok", ""),
    ]
    wait_for(lambda: [r.status for r in _runs("reply")] == ["failed", "failed", "done"], 10, "the runs")
