"""Issue 20.3: vectors for every memory and message written, by a background job that the write queues in its
own transaction (never on the reply path); `flask memories reindex` rebuilds every index, resumably; search
says when it finds by words only, and why."""

import json
import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine
from rq import SimpleWorker
from rq.worker import Worker
from rq_scheduler import Scheduler

from tests import factories
from webapp import search
from webapp.extensions import db
from webapp.jobs import embeddings, replies, schedule
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.embeddings import embed_queued, queue_waiting
from webapp.jobs.queue import rq_queue
from webapp.jobs.replies import request_replies, respond
from webapp.jobs.term_stats import refresh_term_stats
from webapp.models import AgentMemory, JobRun, Message
from webapp.models.search import EmbeddingQueue
from webapp.runtime import priority
from webapp.search import embedder
from webapp.search.embedder import EmbeddingError
from webapp.timeutil import utcnow
from webapp.tools import ToolContext
from webapp.tools.recall import recall

HTMX = {"HX-Request": "true"}


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "recall"])


@pytest.fixture
def chat(admin, ada):
    return factories.chat(admin.account, [ada], "Garden")


@pytest.fixture
def remote_embedder(app, fake_llm):
    """Embeddings from the fake server's /v1/embeddings, as from any OpenAI-compatible provider."""
    app.config.update(EMBEDDING_BASE_URL=fake_llm.base_url, EMBEDDING_MODEL="fake-embedder")
    return "fake-embedder"


def _run_background_jobs(app) -> None:
    SimpleWorker([rq_queue()], connection=app.extensions["redis"]).work(burst=True)


def _queued() -> set[tuple[str, int]]:
    return {tuple(row) for row in db.session.execute(sa.select(EmbeddingQueue.kind, EmbeddingQueue.row_id))}


def _vector(kind: str, row_id: int) -> tuple[str, object] | None:
    """(model, embedding) stored for the row, or None."""
    table, key = search.backend().VECTOR_TABLES[kind][:2]
    if not sa.inspect(db.session.connection()).has_table(table):
        return None
    found = db.session.execute(
        sa.text(f"SELECT model, embedding FROM {table} WHERE {key} = :id"), {"id": row_id}
    ).first()
    return tuple(found) if found else None


def _core_insert(model: type, **values) -> int:
    """A row written with a Core insert on a connection of its own: no session, so no embedding queue."""
    with db.engine.begin() as conn:
        return conn.execute(sa.insert(model).values(**values).returning(model.id)).scalar_one()


# --- every write path queues its rows; the job embeds them ---


def test_a_memory_added_on_the_ledger_is_embedded_by_the_queued_job_and_costed(app, client, signed_in, ada):
    client.post(f"/admin/agents/{ada.id}/memories", data={"content": "Dana likes tea", "memory_type": "core"})
    memory = db.session.scalar(sa.select(AgentMemory))

    assert _queued() == {("memory", memory.id)}
    assert _vector("memory", memory.id) is None  # nothing embedded while the page answered
    assert db.session.scalar(
        sa.select(JobRun.status).where(JobRun.job_type == "embed_memories_and_messages")
    ) == ("queued")

    _run_background_jobs(app)

    assert _vector("memory", memory.id)[0] == embedder.model_name()
    assert _queued() == set()
    [call] = factories.embedding_calls()
    assert (call.status, call.agent_id, call.model) == ("ok", ada.id, embedder.model_name())
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "embed_memories_and_messages"))
    assert (run.status, run.counts["memories"]) == ("done", 1)


def test_an_edit_writes_a_new_vector_a_delete_removes_it_and_a_restore_or_undo_brings_it_back(
    app, client, signed_in, ada
):
    memory = factories.memory(ada, "Dana likes tea")
    _run_background_jobs(app)
    first = _vector("memory", memory.id)

    prefix = f"memory-{memory.id}"
    edit = {f"{prefix}-content": "Dana likes coffee", f"{prefix}-memory_type": "core"}
    assert client.post(f"/admin/memories/{memory.id}", data=edit, headers=HTMX).status_code == 200
    assert _queued() == {("memory", memory.id)}
    _run_background_jobs(app)
    edited = _vector("memory", memory.id)
    assert edited is not None and edited[1] != first[1]

    client.post(f"/admin/memories/{memory.id}/delete", headers=HTMX)
    _run_background_jobs(app)
    assert _vector("memory", memory.id) is None

    client.post(f"/admin/memories/{memory.id}/restore", headers=HTMX)
    _run_background_jobs(app)
    assert _vector("memory", memory.id) == edited

    client.post(f"/admin/memories/{memory.id}/delete", headers=HTMX)
    _run_background_jobs(app)
    undo = client.post(f"/admin/audit/{_last_audit_id('memory_delete')}/undo", headers=HTMX)
    assert undo.status_code == 200
    _run_background_jobs(app)
    assert _vector("memory", memory.id) == edited


def _last_audit_id(action: str) -> int:
    from webapp.models import AuditLog

    return db.session.scalar(sa.select(sa.func.max(AuditLog.id)).where(AuditLog.action == action))


def test_save_memory_in_a_reply_is_embedded_after_the_reply_never_during_it(app, fake_llm, admin, chat, ada):
    question = factories.message(chat, "Remember I like green tea.", author=admin)
    _run_background_jobs(app)
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    fake_llm.reply(tool_calls=[("save_memory", {"content": "Dana likes green tea.", "memory_type": "core"})])
    fake_llm.reply("I'll remember that.")
    before = _vector("message", question.id)

    respond([reply.id])

    memory = db.session.scalar(sa.select(AgentMemory))
    # No vector written on the reply path (a search may embed its query, nothing else).
    assert _vector("memory", memory.id) is None and _vector("message", reply.id) is None
    assert _vector("message", question.id) == before
    assert _queued() == {("memory", memory.id), ("message", reply.id)}

    _run_background_jobs(app)

    assert _vector("memory", memory.id) is not None and _vector("message", reply.id) is not None
    assert _vector("message", question.id) != before  # its text holds the turn after it: the reply
    assert _queued() == set()


def test_memories_a_consolidation_extracts_are_embedded(app, fake_llm, admin, ada):
    chat = factories.chat(admin.account, [ada])
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        factories.message(chat, "My greenhouse key is under the blue can.", author=admin)
    _run_background_jobs(app)
    fake_llm.reply(json.dumps({"journal": [], "core": ["The greenhouse key is under the blue can."]}))

    consolidate_chat(chat.id)
    _run_background_jobs(app)

    [memory] = db.session.scalars(sa.select(AgentMemory)).all()
    assert _vector("memory", memory.id) is not None
    assert _queued() == set()


def test_a_posted_message_an_edit_and_a_finished_reply_each_get_vectors(
    app, client, signed_in, fake_llm, chat
):
    client.post(f"/chats/{chat.id}/messages", data={"content": "Where did I leave the greenhouse key?"})
    question, waiting = db.session.scalars(sa.select(Message).order_by(Message.id)).all()
    assert _queued() == {("message", question.id)}  # the reply waits: only a finished one counts
    _run_background_jobs(app)
    first = _vector("message", question.id)

    client.post(f"/chats/{chat.id}/messages/{question.id}/edit", data={"content": "Where is the shed key?"})
    assert _queued() == {("message", question.id), ("message", waiting.id)}  # edited; its reply replaced
    _run_background_jobs(app)
    edited = _vector("message", question.id)
    assert edited not in (None, first)

    reply = db.session.scalar(sa.select(Message).where(Message.id > waiting.id))
    fake_llm.reply("By the shed door.")
    respond([reply.id])
    assert _queued() == {("message", reply.id)}
    _run_background_jobs(app)
    assert _vector("message", reply.id) is not None
    assert _vector("message", question.id) not in (first, edited)  # its text now holds the reply after it


def test_a_replys_embedding_run_is_queued_once_its_run_is_closed_not_while_the_person_waits(
    app, fake_llm, admin, chat, ada, monkeypatch
):
    """The reply's commit holds its queue row; the run that embeds it is queued after the reply's run closed."""
    factories.message(chat, "Where is the greenhouse key?", author=admin)
    _run_background_jobs(app)
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    fake_llm.reply("Under the blue can.")
    reply_run_when_queued = []
    queue_for_real = embeddings.enqueue

    def watched(func, *args, **kwargs):
        if func is embed_queued:
            reply_run = sa.select(JobRun.status).where(JobRun.job_type == "reply")
            reply_run_when_queued.append(db.session.scalar(reply_run))
        return queue_for_real(func, *args, **kwargs)

    monkeypatch.setattr(embeddings, "enqueue", watched)

    respond([reply.id])

    assert reply_run_when_queued == ["done"]
    assert _queued() == {("message", reply.id)}
    _run_background_jobs(app)
    assert _vector("message", reply.id) is not None and _queued() == set()


def test_a_streaming_reply_is_queued_once_it_is_done(app, admin, chat, ada):
    reply = factories.message(chat, "", author=ada, status="streaming")
    for text in ("Under", "Under the", "Under the blue can."):
        reply.content = text
        db.session.commit()
    assert _queued() == set()

    reply.status = "done"
    db.session.commit()

    assert _queued() == {("message", reply.id)}


def test_a_queued_job_for_every_commit_that_wrote_but_one_waiting_at_most(app, ada):
    factories.memory(ada, "one")
    factories.memory(ada, "two")

    runs = db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "embed_memories_and_messages")).all()
    assert [r.status for r in runs] == ["queued"]
    assert [j.func_name for j in rq_queue().get_jobs()] == ["webapp.jobs.embeddings.embed_queued"]


# --- failures lose nothing ---


def test_an_endpoint_error_fails_the_run_and_keeps_the_queue_for_the_hourly_finder(
    app, fake_llm, remote_embedder, ada
):
    memory = factories.memory(ada, "Dana likes tea")
    fake_llm.fail(500, "embedder down", model=remote_embedder)

    with pytest.raises(EmbeddingError):
        embed_queued()

    assert _queued() == {("memory", memory.id)}
    failed = db.session.scalar(sa.select(JobRun).where(JobRun.status == "failed"))
    assert "embedder down" in failed.error
    assert [c.status for c in factories.embedding_calls()] == ["error"]

    assert queue_waiting() == {"waiting": 1}  # what the hourly schedule runs
    _run_background_jobs(app)

    assert _vector("memory", memory.id)[0] == "fake-embedder"
    assert _queued() == set()
    assert queue_waiting() == {"waiting": 0}


def test_a_run_killed_midway_keeps_what_it_committed_and_a_later_run_does_the_rest(app, ada, monkeypatch):
    memories = [factories.memory(ada, f"memory {i}") for i in range(3)]
    monkeypatch.setattr(embeddings, "BATCH", 1)
    index = embeddings.indexing.index_memories
    calls = []

    def killed_at_the_second_batch(ids):
        calls.append(ids)
        if len(calls) == 2:
            raise SystemExit("killed")  # not an Exception: nothing of the run's own handling runs
        return index(ids)

    monkeypatch.setattr(embeddings.indexing, "index_memories", killed_at_the_second_batch)
    with pytest.raises(SystemExit):
        embed_queued()
    db.session.rollback()

    assert _queued() == {("memory", m.id) for m in memories[1:]}
    monkeypatch.setattr(embeddings.indexing, "index_memories", index)
    assert embed_queued()["memories"] == 2
    assert all(_vector("memory", m.id) for m in memories) and _queued() == set()


def test_a_memory_written_again_while_it_was_being_embedded_stays_queued_for_the_next_run(
    app, ada, monkeypatch
):
    memory = factories.memory(ada, "The key is under the can.")
    embed = embedder.embed

    def written_again_meanwhile(texts, **ids):
        vectors = embed(texts, **ids)
        if ids.get("agent_id") == ada.id and "The key is under the can." in texts:
            with sa.orm.Session(db.engine) as writer:  # another transaction, committed during the embedding
                writer.execute(sa.update(AgentMemory).values(content="The key is in the shed."))
                embeddings.record([("memory", memory.id)], writer)
                writer.commit()
        return vectors

    monkeypatch.setattr(embedder, "embed", written_again_meanwhile)

    first = embed_queued()
    stale = _vector("memory", memory.id)
    second = embed_queued()

    assert first["left_for_later"] == 1 and _queued() == set()
    assert second["memories"] == 1 and _vector("memory", memory.id) != stale


# --- no vectors in this database ---


def test_without_vector_support_the_job_drops_its_rows_reindex_says_so_and_health_too(
    app, client, signed_in, runner, ada, monkeypatch
):
    monkeypatch.setattr(search.backend(), "vectors_available", lambda: False)
    factories.memory(ada, "Dana likes tea")

    counts = embed_queued()
    output = runner.invoke(args=["memories", "reindex"])
    check = client.get("/healthz").get_json()["checks"]["search"]

    assert counts["dropped"] == 1 and counts["vectors"].startswith("not available (")
    assert _queued() == set()
    assert output.exit_code == 0
    assert "agent_memories: 1 rows indexed" in output.output
    assert "vectors: not available (the database has no vector extension" in output.output
    assert check["ok"] is False
    assert check["detail"].startswith("words only: the database has no vector extension")


# --- flask memories reindex ---


def test_reindex_embeds_rows_any_path_wrote_and_a_second_run_adds_nothing(app, runner, admin, chat, ada):
    factories.memory(ada, "Written through the app")
    _run_background_jobs(app)
    bypassed = _core_insert(
        AgentMemory, agent_id=ada.id, content="The key is under the can.", memory_type="core"
    )
    said = [
        _core_insert(Message, chat_id=chat.id, role="user", content=text, status="done", user_id=admin.id)
        for text in ("Hello Ada.", "Where is the key?")
    ]
    assert _vector("memory", bypassed) is None and _queued() == set()

    first = runner.invoke(args=["memories", "reindex"])
    second = runner.invoke(args=["memories", "reindex"])

    assert first.exit_code == 0, first.output
    assert "agent_memories: 2 rows indexed" in first.output and "messages: 2 rows indexed" in first.output
    assert f"vectors ({embedder.model_name()}): 1 memory and 2 messages embedded" in first.output
    assert _vector("memory", bypassed) is not None and all(_vector("message", i) for i in said)
    assert f"vectors ({embedder.model_name()}): nothing missing" in second.output


def test_reindex_all_rewrites_every_vector_and_removes_those_of_rows_gone(app, runner, ada):
    kept, gone = factories.memory(ada, "kept"), factories.memory(ada, "soft-deleted with a Core update")
    _run_background_jobs(app)
    with db.engine.begin() as conn:
        conn.execute(sa.update(AgentMemory).where(AgentMemory.id == gone.id).values(deleted_at=utcnow()))

    result = runner.invoke(args=["memories", "reindex", "--all"])

    assert "1 memory and 0 messages embedded" in result.output
    assert "vectors: 1 removed" in result.output
    assert _vector("memory", kept.id) is not None and _vector("memory", gone.id) is None


def test_reindex_after_a_model_change_embeds_everything_again_with_the_new_model(app, runner, fake_llm, ada):
    memory = factories.memory(ada, "Dana likes tea")
    _run_background_jobs(app)  # the local model's vector
    app.config.update(EMBEDDING_BASE_URL=fake_llm.base_url, EMBEDDING_MODEL="fake-embedder")

    result = runner.invoke(args=["memories", "reindex"])

    assert "vectors (fake-embedder): 1 memory and 0 messages embedded" in result.output
    assert _vector("memory", memory.id)[0] == "fake-embedder"


def test_a_stopped_reindex_goes_on_where_it_stopped(app, runner, ada, fake_llm, remote_embedder, monkeypatch):
    memories = [factories.memory(ada, f"memory {i}") for i in range(3)]
    monkeypatch.setattr("webapp.search.indexing.BATCH", 1)
    fake_llm.reply(model=remote_embedder)  # vectors for the first batch
    fake_llm.fail(500, "embedder down", model=remote_embedder)  # then it fails

    stopped = runner.invoke(args=["memories", "reindex"])
    resumed = runner.invoke(args=["memories", "reindex"])

    assert stopped.exit_code == 1 and "run it again to go on" in stopped.output
    assert "2 memories and 0 messages embedded" in resumed.output
    assert all(_vector("memory", m.id) for m in memories)


# --- search by words when the embedder fails, and saying so ---


def _all_parts_up(fake_redis) -> None:
    Worker(["cairn-replies", "cairn"], connection=fake_redis).register_birth()
    Scheduler(connection=fake_redis).register_birth()


def test_with_an_embedder_answering_500_recall_finds_by_words_and_health_says_why(
    app, client, signed_in, fake_llm, fake_redis, remote_embedder, chat, ada
):
    memory = factories.memory(ada, "The spare greenhouse key is under the blue watering can.")
    _run_background_jobs(app)  # vectors exist, so a search embeds its query
    _all_parts_up(fake_redis)
    fake_llm.fail(500, "embedder down", model=remote_embedder)
    reply = factories.message(chat, "", author=ada, status="streaming")

    found = recall(ToolContext(agent=ada, chat=chat, message=reply), "greenhouse key")

    assert [r["memory_id"] for r in found["results"] if "memory_id" in r] == [memory.id]
    assert factories.embedding_calls()[-1].status == "error"
    response = client.get("/healthz")
    assert response.status_code == 200  # search still works, by words
    search_part = response.get_json()["checks"]["search"]
    assert search_part["ok"] is False
    assert search_part["detail"].startswith("words only: the embedding endpoint failed")
    assert "embedder down" in search_part["detail"]
    assert "words only: the embedding endpoint failed" in client.get(f"/admin/agents/{ada.id}/memories").text


def test_health_says_words_and_meaning_with_the_model_and_what_waits(app, client, signed_in, fake_redis, ada):
    _all_parts_up(fake_redis)
    factories.memory(ada, "Dana likes tea")

    response = client.get("/healthz")
    page = client.get(f"/admin/agents/{ada.id}/memories").text

    line = f"words and meaning ({embedder.model_name()}); 1 memory or message waits for its vector"
    assert response.status_code == 200
    assert response.get_json()["checks"]["search"] == {"ok": True, "detail": line}
    assert f"Search: {line}" in page


# --- term statistics ---


def test_term_statistics_are_refreshed_hourly_by_a_recorded_job(app, ada, chat):
    factories.memory(ada, "The greenhouse key is under the can.")
    factories.message(chat, "Where is the greenhouse key?")

    assert refresh_term_stats() == {"database": db.engine.dialect.name}

    by_func = {s.func: s for s in schedule.SCHEDULES}
    term_stats = by_func["webapp.jobs.term_stats.refresh_term_stats"]
    assert term_stats.id == "cairn-term-stats" and term_stats.cron.endswith(" * * * *")
    assert by_func["webapp.jobs.embeddings.queue_waiting"].cron.endswith(" * * * *")
    if db.engine.dialect.name == "postgresql":
        words = db.session.scalars(
            sa.text("SELECT term FROM search_term_stats WHERE table_name = 'agent_memories'")
        )
        assert {"greenhous", "key"} <= set(words)
    else:  # the query planner's statistics: without them SQLite guesses how to read an agent's chats
        analyzed = db.session.scalars(sa.text("SELECT DISTINCT tbl FROM sqlite_stat1"))
        assert {"agent_memories", "chat_agents", "chats", "messages"} <= set(analyzed)


# --- replies first ---


def test_a_messages_embedding_waits_while_a_reply_of_the_same_worker_builds_its_prompt(
    app, admin, chat, ada, fake_llm, monkeypatch
):
    """The embedding run queued with a message, running beside the reply to it, embeds only once the reply's
    prompt is built (and never for longer than priority.MAX_WAIT_SECONDS)."""
    order: list[str] = []
    prompt_started, run_waiting = threading.Event(), threading.Event()
    waits = priority.after_replies

    def after_replies(*args, **kwargs):
        run_waiting.set()
        waits(*args, **kwargs)

    def embedded(ids, using=None):
        order.append("message embedded")
        return len(ids)

    build = replies.build_prompt

    def building(*args, **kwargs):
        prompt_started.set()
        assert run_waiting.wait(5)  # the embedding run reached its first batch meanwhile
        order.append("prompt built")
        return build(*args, **kwargs)

    monkeypatch.setattr(priority, "after_replies", after_replies)
    monkeypatch.setattr(embeddings.indexing, "index_messages", embedded)
    monkeypatch.setattr(replies, "build_prompt", building)
    factories.message(chat, "Where is the shed key?", author=admin)
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    fake_llm.reply("By the shed door.")

    def background() -> None:
        with app.app_context():
            assert prompt_started.wait(5)
            embed_queued()

    thread = threading.Thread(target=background)
    thread.start()
    respond([reply.id])
    thread.join(10)

    assert order == ["prompt built", "message embedded"]
    assert db.session.get(Message, reply.id).status == "done"


def test_background_work_waits_for_replies_at_most_a_while():
    with priority.reply_building():
        priority.after_replies(max_wait=0.01)  # returns although the reply is still building
    priority.after_replies(max_wait=60)  # returns at once: no reply is building
