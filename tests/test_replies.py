"""Reply jobs against the fake model server: the agent's model, the prompt, the tool loop, failures, retries."""

import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
from rq import SimpleWorker
from rq.job import JobStatus

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.queue import rq_queue, worker_queues
from webapp.jobs.replies import ReplyFailed, request_replies, respond
from webapp.jobs.reply_stream import DELTA_INTERVAL_SECONDS
from webapp.models import AgentMemory, AuditLog, JobRun, LlmCall, Message


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", system_prompt="You are Ada.")


@pytest.fixture
def chat(admin, ada):
    chat = factories.chat(admin.account, [ada])
    factories.message(chat, "Remember I like green tea.", author=admin)
    return chat


def _pending(chat, *agents) -> list[Message]:
    replies = request_replies(chat, list(agents))
    db.session.commit()
    return replies


def _fresh(message: Message) -> Message:
    db.session.expire_all()
    return db.session.get(Message, message.id)


def test_a_reply_uses_the_agents_model_and_prompt_and_is_stored(app, fake_llm, chat, ada):
    [reply] = _pending(chat, ada)
    fake_llm.reply("Noted: green tea.")

    assert respond([reply.id]) == {"replies": 1}

    request = fake_llm.requests[-1]
    assert request["model"] == "ada-model" and request["stream"] is True
    assert request["messages"][0] == {"role": "system", "content": "You are Ada."}
    assert request["messages"][1] == {"role": "user", "content": "dana: Remember I like green tea."}
    assert "# Your memory" in request["messages"][-1]["content"]
    assert [t["function"]["name"] for t in request["tools"]] == ["save_memory"]
    reply = _fresh(reply)
    assert (reply.status, reply.content, reply.error) == ("done", "Noted: green tea.", None)
    assert (reply.input_tokens, reply.output_tokens) == (11, 3)
    call = db.session.scalar(sa.select(LlmCall))
    assert (call.purpose, call.agent_id, call.chat_id, call.model) == ("reply", ada.id, chat.id, "ada-model")
    assert call.job_run_id == db.session.scalar(sa.select(JobRun.id).where(JobRun.job_type == "reply"))


def test_the_tool_loop_saves_a_memory_and_feeds_the_result_back(app, fake_llm, chat, ada):
    [reply] = _pending(chat, ada)
    fake_llm.reply(
        tool_calls=[("save_memory", {"content": "Dana likes green tea.", "memory_type": "journal"})]
    )
    fake_llm.reply("I'll remember that.")

    respond([reply.id])

    memory = db.session.scalar(sa.select(AgentMemory))
    assert (memory.agent_id, memory.content, memory.memory_type) == (
        ada.id,
        "Dana likes green tea.",
        "journal",
    )
    follow_up = fake_llm.requests[-1]["messages"]
    assert follow_up[-2]["tool_calls"][0]["function"]["name"] == "save_memory"
    result = json.loads(follow_up[-1]["content"])
    assert follow_up[-1]["role"] == "tool" and result["saved"] is True
    assert "fade after 7 days" in result["note"]
    reply = _fresh(reply)
    assert reply.content == "I'll remember that."
    assert reply.tools_used == [
        {
            "tool": "save_memory",
            "state": "done",
            "chip": "Saved to journal: “Dana likes green tea.”",
            "memory_id": memory.id,
            "memory_type": "journal",
        }
    ]
    audit = db.session.scalar(sa.select(AuditLog))
    assert (audit.action, audit.auditable_id, audit.agent_id, audit.user_id) == (
        "memory_create",
        memory.id,
        ada.id,
        None,
    )


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("save_memory", '{"content": ', "not valid JSON"),
        ("save_memory", {"content": "x"}, "'memory_type' is a required property"),
        ("save_memory", {"content": "x", "memory_type": "dream"}, "memory_type: 'dream' is not one of"),
        ("delete_everything", {}, "You have no tool named 'delete_everything'. Available: save_memory."),
    ],
)
def test_bad_tool_calls_get_an_error_result_the_model_can_read(
    app, fake_llm, chat, ada, name, arguments, error
):
    [reply] = _pending(chat, ada)
    fake_llm.reply(tool_calls=[(name, arguments)])
    fake_llm.reply("Sorry, done.")

    respond([reply.id])

    result = json.loads(fake_llm.requests[-1]["messages"][-1]["content"])
    assert error in result["error"]
    assert db.session.scalar(sa.select(sa.func.count()).select_from(AgentMemory)) == 0
    assert _fresh(reply).status == "done"


def test_a_tool_the_agent_has_not_enabled_is_refused(app, fake_llm, chat, ada):
    ada.enabled_tools = []
    db.session.commit()
    [reply] = _pending(chat, ada)
    fake_llm.reply(tool_calls=[("save_memory", {"content": "x", "memory_type": "core"})])
    fake_llm.reply("ok")

    respond([reply.id])

    assert "tools" not in fake_llm.requests[0]
    assert "You have no tool named 'save_memory'" in fake_llm.requests[-1]["messages"][-1]["content"]
    assert db.session.scalar(sa.select(sa.func.count()).select_from(AgentMemory)) == 0


def test_a_reply_never_offers_the_refinement_tool(app, fake_llm, chat, ada):
    ada.enabled_tools = ["save_memory", "refine_memory"]  # not possible from the form; say it got there
    db.session.commit()
    [reply] = _pending(chat, ada)
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "x"})])
    fake_llm.reply("ok")

    respond([reply.id])

    assert [tool["function"]["name"] for tool in fake_llm.requests[0]["tools"]] == ["save_memory"]
    result = json.loads(fake_llm.requests[-1]["messages"][-1]["content"])
    assert result["error"] == "You have no tool named 'refine_memory'. Available: save_memory."
    assert _fresh(reply).status == "done"


def test_the_tool_loop_is_bounded(app, fake_llm, chat, ada):
    app.config["REPLY_MAX_TOOL_TURNS"] = 3
    [reply] = _pending(chat, ada)
    for i in range(3):
        fake_llm.reply(
            "thinking", tool_calls=[("save_memory", {"content": f"m{i}", "memory_type": "journal"})]
        )

    respond([reply.id])

    assert len(fake_llm.requests) == 3
    assert "tools" not in fake_llm.requests[-1]  # the last turn must answer in text
    assert _fresh(reply).content == "thinking\n\nthinking\n\nthinking"  # text before each tool call is kept


def test_ask_all_answers_in_order_each_seeing_the_replies_before_it(app, fake_llm, admin, ada):
    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil])
    factories.message(chat, "Thoughts?", author=admin)
    first, second = _pending(chat, ada, basil)
    fake_llm.reply("Ada says yes.")
    fake_llm.reply("Basil agrees with Ada.")

    respond([first.id, second.id])

    assert [r["model"] for r in fake_llm.requests] == ["ada-model", "basil-model"]
    assert {"role": "user", "content": "Ada: Ada says yes."} in fake_llm.requests[1]["messages"]
    assert (_fresh(first).content, _fresh(second).content) == ("Ada says yes.", "Basil agrees with Ada.")


def test_a_model_error_marks_the_reply_failed_with_its_reason(app, fake_llm, chat, ada):
    [reply] = _pending(chat, ada)
    fake_llm.fail(400, "model not found")

    with pytest.raises(ReplyFailed):
        respond([reply.id])

    reply = _fresh(reply)
    assert reply.status == "failed"
    assert reply.error == "The model returned HTTP 400: model not found"
    assert reply.content == ""  # partial text is never kept as an answer
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "reply"))
    assert run.status == "failed"


def test_one_failed_agent_does_not_stop_the_others(app, fake_llm, admin, ada):
    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil])
    first, second = _pending(chat, ada, basil)
    fake_llm.fail(401, "bad key")
    fake_llm.reply("Basil here.")

    with pytest.raises(ReplyFailed):
        respond([first.id, second.id])

    assert (_fresh(first).status, _fresh(second).status) == ("failed", "done")


def test_an_empty_answer_is_a_failure_not_a_blank_message(app, fake_llm, chat, ada):
    [reply] = _pending(chat, ada)
    fake_llm.reply("   ")

    with pytest.raises(ReplyFailed):
        respond([reply.id])

    assert (_fresh(reply).status, _fresh(reply).error) == (
        "failed",
        "The model finished without writing anything.",
    )


def test_a_retryable_error_retries_with_backoff_and_then_succeeds(app, fake_llm, chat, ada):
    [reply] = _pending(chat, ada)
    [job] = rq_queue("replies").get_jobs()
    fake_llm.fail(503, "overloaded")
    worker = SimpleWorker(worker_queues(), connection=app.extensions["redis"])

    worker.work(burst=True)

    job.refresh()
    assert job.get_status() == JobStatus.SCHEDULED
    waiting = _fresh(reply)
    assert (
        waiting.status == "pending"
        and "HTTP 503" in waiting.error
        and "Trying again shortly" in waiting.error
    )

    fake_llm.reply("Back now.")
    rq_queue("replies").enqueue_job(job)  # what RQ's scheduler does when the backoff interval ends
    worker.work(burst=True)

    assert (_fresh(reply).status, _fresh(reply).content) == ("done", "Back now.")
    runs = db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "reply").order_by(JobRun.id))
    assert [r.status for r in runs] == ["failed", "done"]


def test_when_retries_run_out_the_reply_fails_visibly(app, fake_llm, chat, ada):
    app.config["JOB_MAX_RETRIES"] = 0
    [reply] = _pending(chat, ada)
    fake_llm.fail(503, "overloaded")

    SimpleWorker(worker_queues(), connection=app.extensions["redis"]).work(burst=True)

    assert (_fresh(reply).status, _fresh(reply).error) == (
        "failed",
        "The model returned HTTP 503: overloaded",
    )


def test_a_finished_reply_is_not_generated_twice(app, fake_llm, chat, ada):
    [reply] = _pending(chat, ada)
    respond([reply.id])

    assert respond([reply.id]) == {"replies": 0}
    assert len(fake_llm.requests) == 1


def test_streamed_text_is_published_for_the_chat_page(app, fake_llm, chat, ada, fake_redis):
    from webapp import events

    pubsub = fake_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(events.channel(chat.id))
    [reply] = _pending(chat, ada)
    fake_llm.reply("Hello there friend")
    fake_llm.chunk_delay = DELTA_INTERVAL_SECONDS * 1.5  # a word at a time, slower than the page is updated

    respond([reply.id])

    polled = (pubsub.get_message(timeout=0.01) for _ in range(50))
    published = [json.loads(m["data"]) for m in polled if m is not None]
    assert [(e["kind"], e["text"]) for e in published] == [
        ("final", ""),  # its turn began: the page shows it thinking
        ("delta", "Hello"),
        ("delta", " there"),
        ("delta", " friend"),
        ("final", ""),
    ]
    assert {e["message_id"] for e in published} == {reply.id}


def test_text_streamed_faster_than_the_page_is_updated_goes_in_fewer_events(
    app, fake_llm, chat, ada, fake_redis
):
    from webapp import events

    pubsub = fake_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(events.channel(chat.id))
    [reply] = _pending(chat, ada)
    text = " ".join(f"word{n}" for n in range(40))
    fake_llm.reply(text)
    fake_llm.chunk_delay = DELTA_INTERVAL_SECONDS / 8  # about 80 tokens a second

    respond([reply.id])

    polled = (pubsub.get_message(timeout=0.01) for _ in range(100))
    deltas = [e["text"] for m in polled if m is not None and (e := json.loads(m["data"]))["kind"] == "delta"]
    assert deltas[0] == "word0"  # the first token at once
    assert 2 <= len(deltas) <= 40 / 3  # then a few tokens per event
    assert text.startswith("".join(deltas))  # in order, none lost or repeated
    assert _fresh(reply).content == text  # the final event shows the whole of it


def test_a_reply_another_worker_is_generating_is_not_generated_twice(app, fake_llm, chat, ada, fake_redis):
    [reply] = _pending(chat, ada)
    fake_redis.set(f"cairn:lock:reply:{reply.id}", "another worker")

    assert respond([reply.id]) == {"replies": 0}
    assert fake_llm.requests == [] and _fresh(reply).status == "pending"


def test_an_unexpected_error_fails_that_reply_and_the_others_still_answer(
    app, fake_llm, admin, ada, monkeypatch
):
    from webapp.jobs import replies

    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil])
    first, second = _pending(chat, ada, basil)
    real_build = replies.build_prompt

    def broken_for_ada(chat_row, agent, **kwargs):
        if agent.name == "Ada":
            raise RuntimeError("a bug")
        return real_build(chat_row, agent, **kwargs)

    monkeypatch.setattr(replies, "build_prompt", broken_for_ada)
    fake_llm.reply("Basil answers.")

    with pytest.raises(ReplyFailed):
        respond([first.id, second.id])

    assert (_fresh(first).status, _fresh(second).status) == ("failed", "done")
    assert "internal error" in _fresh(first).error


def test_stop_keeps_what_the_reply_wrote_so_far(app, fake_llm, chat, ada, fake_redis):
    from webapp import events
    from webapp.jobs.replies import stop_reply

    [reply] = _pending(chat, ada)
    fake_llm.reply("One two three four")
    fake_llm.chunk_delay = DELTA_INTERVAL_SECONDS * 1.5  # each word sent to the page as it comes
    relay = events.publish

    def publish_then_stop(chat_id, kind, message_id, text=""):
        relay(chat_id, kind, message_id, text)
        if text == " two":  # the person presses Stop while the second word streams
            stop_reply(db.session.get(Message, message_id))

    events.publish = publish_then_stop
    try:
        respond([reply.id])
    finally:
        events.publish = relay

    reply = _fresh(reply)
    assert (reply.status, reply.content, reply.error) == ("done", "One two", "Stopped.")
    assert not fake_redis.exists(f"cairn:stop:{reply.id}")


def test_each_tool_call_shows_as_a_step_then_a_chip(app, fake_llm, chat, ada, fake_redis):
    from webapp import events

    pubsub = fake_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(events.channel(chat.id))
    seen: list[tuple[str, list | None]] = []
    relay = events.publish

    def record(chat_id, kind, message_id, text=""):
        if kind == "final":
            shown = db.session.get(Message, message_id)
            seen.append((shown.content, [s["state"] for s in shown.tools_used or []]))
        relay(chat_id, kind, message_id, text)

    [reply] = _pending(chat, ada)
    fake_llm.reply(
        "Let me note that.",
        tool_calls=[("save_memory", {"content": "Dana likes green tea.", "memory_type": "journal"})],
    )
    fake_llm.reply("Done.")
    events.publish = record
    try:
        respond([reply.id])
    finally:
        events.publish = relay

    assert seen == [
        ("", []),  # its turn: thinking
        ("Let me note that.", ["running"]),  # "Saving a memory…", the text before the call kept
        ("Let me note that.", ["done"]),  # the chip
        ("Let me note that.\n\nDone.", ["done"]),
    ]


# Paused agents, retries and interruptions (issue 12 item 11, issue 11 item 2)


def test_an_agent_paused_after_an_ask_all_was_queued_does_not_answer(app, fake_llm, admin, ada, client):
    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil])
    first, second = _pending(chat, ada, basil)
    basil.paused = True
    db.session.commit()

    respond([first.id, second.id])

    assert [r["model"] for r in fake_llm.requests] == ["ada-model"]
    assert (_fresh(second).status, _fresh(second).error) == ("failed", "Basil was paused before answering.")
    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    refused = client.post(f"/chats/{chat.id}/messages/{second.id}/retry")
    assert refused.status_code == 422 and "Basil is paused" in refused.text


def _stuck(reply: Message) -> None:
    reply.status, reply.updated_at = "streaming", reply.updated_at - timedelta(minutes=11)
    db.session.commit()


def test_a_reply_still_being_written_cannot_be_retried(app, chat, ada, admin, client):
    from webapp.jobs.queue import held_lock

    [reply] = _pending(chat, ada)
    db.session.execute(sa.update(JobRun).values(status="done"))  # its job is not waiting any more
    _stuck(reply)
    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    url = f"/chats/{chat.id}/messages/{reply.id}/retry"

    with held_lock(f"reply:{reply.id}"):  # a worker is generating it right now
        refused = client.post(url)
    assert refused.status_code == 422 and "still being written" in refused.text

    assert client.post(url).status_code == 200  # its worker is gone: a stuck reply may be retried
    assert client.post(url).status_code == 422  # and once queued, not twice
    assert len(rq_queue("replies").get_jobs()) == 2  # the first request's job, and the retry's


def test_a_reply_waiting_for_a_worker_cannot_be_retried(app, chat, ada, admin, client):
    [reply] = _pending(chat, ada)
    _stuck(reply)
    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})

    refused = client.post(f"/chats/{chat.id}/messages/{reply.id}/retry")

    assert refused.status_code == 422 and "already waiting for a worker" in refused.text


def test_a_reply_whose_worker_dies_twice_fails_with_a_working_retry(app, chat, ada, admin, client):
    import time_machine

    from webapp.jobs.queue import HEARTBEAT_SECONDS
    from webapp.jobs.sweep import sweep
    from webapp.timeutil import utcnow

    [reply] = _pending(chat, ada)
    for attempt in range(2):  # each time a worker takes the run, then dies with it (kill -9)
        run = db.session.scalar(
            sa.select(JobRun).where(JobRun.job_type == "reply", JobRun.status == "queued")
        )
        run.status, reply.status = "running", "streaming"
        db.session.commit()
        sweep()
        with time_machine.travel(utcnow() + timedelta(seconds=2 * HEARTBEAT_SECONDS + 1), tick=False):
            assert sweep()["interrupted"] == 1
        if attempt == 0:
            assert (_fresh(reply).status, _fresh(reply).error) == (
                "pending",
                "The worker writing this reply stopped; trying again.",
            )

    assert _fresh(reply).status == "failed" and "stopped again" in _fresh(reply).error
    runs = db.session.scalars(sa.select(JobRun).order_by(JobRun.id)).all()
    assert [r.status for r in runs if r.job_type == "reply"] == ["interrupted", "interrupted"]
    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    assert client.post(f"/chats/{chat.id}/messages/{reply.id}/retry").status_code == 200
    assert _fresh(reply).status == "pending"


def test_a_reply_stopped_at_its_time_limit_fails_with_a_working_retry(
    app, fake_llm, chat, ada, admin, client, monkeypatch
):
    from webapp.jobs import queue

    # A limit of 5 seconds (one turn of a 5-second model timeout, no margin), well past what building the prompt
    # takes on a busy host; the model then goes silent.
    monkeypatch.setattr(queue, "JOB_MARGIN_SECONDS", 0)
    app.config.update(LLM_TIMEOUT_SECONDS=5, REPLY_MAX_TOOL_TURNS=1)
    [reply] = _pending(chat, ada)
    [job] = rq_queue("replies").get_jobs()
    fake_llm.hang("Let me think", seconds=12)

    SimpleWorker(worker_queues(), connection=app.extensions["redis"]).work(burst=True)

    timed_out = "Timed out: the job ran past its time limit of 5 seconds and was stopped."
    assert (_fresh(reply).status, _fresh(reply).error) == ("failed", f"{timed_out} Retry to ask again.")
    [run] = db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "reply")).all()
    assert (run.status, run.error) == ("failed", timed_out)
    job.refresh()
    assert job.get_status() == JobStatus.FAILED  # not retried by RQ: the person decides
    # the request it cut off is in the ledger
    [call] = db.session.scalars(sa.select(LlmCall).where(LlmCall.purpose == "reply")).all()
    assert call.status == "error" and "JobTimeoutException" in call.error

    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    assert client.post(f"/chats/{chat.id}/messages/{reply.id}/retry").status_code == 200
    fake_llm.reply("Here it is.")
    SimpleWorker(worker_queues(), connection=app.extensions["redis"]).work(burst=True)
    assert (_fresh(reply).status, _fresh(reply).content) == ("done", "Here it is.")


# Never two jobs for one reply


def _reply_runs() -> list[JobRun]:
    db.session.expire_all()
    return db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "reply").order_by(JobRun.id)).all()


def test_a_reply_stopped_while_waiting_then_retried_is_answered_by_its_one_job(
    app, fake_llm, chat, ada, admin, client
):
    [reply] = _pending(chat, ada)
    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    client.post(f"/chats/{chat.id}/messages/{reply.id}/stop")
    assert (_fresh(reply).status, _fresh(reply).error) == ("failed", "Stopped before it began.")

    assert client.post(f"/chats/{chat.id}/messages/{reply.id}/retry").status_code == 200

    assert len(rq_queue("replies").get_jobs()) == 1 and [r.status for r in _reply_runs()] == ["queued"]
    fake_llm.reply("Green tea, noted.")
    SimpleWorker(worker_queues(), connection=app.extensions["redis"]).work(burst=True)
    assert (_fresh(reply).status, _fresh(reply).content) == ("done", "Green tea, noted.")
    assert [r.status for r in _reply_runs()] == ["done"]


def test_a_reply_retried_while_its_job_answers_the_others_is_answered_by_that_job(
    app, fake_llm, admin, ada, client, monkeypatch
):
    from webapp import events

    basil = factories.agent(admin.account, "Basil")
    chat = factories.chat(admin.account, [ada, basil])
    factories.message(chat, "Thoughts?", author=admin)
    first, second = _pending(chat, ada, basil)
    client.post("/login", data={"email": admin.email, "password": factories.PASSWORD})
    client.post(f"/chats/{chat.id}/messages/{first.id}/stop")  # Ada's turn is skipped
    fake_llm.reply("Basil thinks so.")
    fake_llm.reply("Ada, after all.")
    retried, publish = [], events.publish

    def retry_while_basil_writes(chat_id: int, kind: str, message_id: int, text: str = "") -> None:
        publish(chat_id, kind, message_id, text)
        if kind == "delta" and message_id == second.id and not retried:
            retried.append(client.post(f"/chats/{chat.id}/messages/{first.id}/retry").status_code)

    monkeypatch.setattr(events, "publish", retry_while_basil_writes)
    SimpleWorker(worker_queues(), connection=app.extensions["redis"]).work(burst=True)

    assert retried == [200]
    assert (_fresh(second).status, _fresh(second).content) == ("done", "Basil thinks so.")
    assert (_fresh(first).status, _fresh(first).content) == ("done", "Ada, after all.")
    assert [r.status for r in _reply_runs()] == ["done"]  # one job answered both


def test_redis_restarting_while_a_reply_streams_does_not_fail_it(
    app, fake_llm, chat, ada, fake_redis, monkeypatch
):
    """Stop is looked up in Redis as the text streams; a Redis that is restarting meanwhile (its live events
    are already best-effort) must not turn the reply into "could not build this reply"."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    def refused(*args, **kwargs):
        raise RedisConnectionError("Error 111 connecting to redis.sock. Connection refused.")

    [reply] = _pending(chat, ada)
    fake_llm.reply("Still here after the outage.")
    monkeypatch.setattr(fake_redis, "exists", refused)

    respond([reply.id])

    assert (_fresh(reply).status, _fresh(reply).content) == ("done", "Still here after the outage.")


def test_a_reply_runs_the_same_statements_however_long_its_chat(app, fake_llm, admin, ada):
    """The reply job's own work is a fixed number of statements (bench.job_overhead prints them): the message is
    read with its chat, agent and sources in one statement each time a commit expired it, the transcript without
    its messages' sources."""

    def statements_for(messages: int) -> list[str]:
        chat = factories.chat(admin.account, [ada])
        for i in range(messages):
            factories.message(chat, f"Message {i}: I like green tea.", author=admin)
            factories.memory(ada, f"Memory {messages}-{i}: green tea.", "core")
        [reply] = _pending(chat, ada)
        reply_id = reply.id
        db.session.expire_all()  # as a worker's job starts: nothing loaded
        with count_queries() as counted:
            respond([reply_id])
        assert _fresh(reply).status == "done"
        return counted.statements

    short, long = statements_for(2), statements_for(60)

    assert len(short) == len(long) <= 40
    assert not [s for s in long if s.lstrip().startswith("SELECT reply_sources")]
