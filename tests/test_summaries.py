"""Spec 003 summaries: the debounce, the agent's view of its other chats, the summary job and its triggers."""

import logging
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine
from rq import SimpleWorker

from tests import factories
from tests.querycount import count_queries
from webapp.extensions import db
from webapp.jobs.queue import rq_queue
from webapp.jobs.replies import request_replies, respond
from webapp.jobs.summaries import clean_summary, summarize
from webapp.llm import LLMError
from webapp.models import ChatAgent, JobRun, LlmCall
from webapp.models.access import chats_heard_in
from webapp.models.chats import other_conversation_summaries
from webapp.timeutil import utcnow

NOW = "2026-11-21 12:00:00Z"


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", system_prompt="You are Ada, a gardener.")


@pytest.fixture
def basil(admin):
    return factories.agent(admin.account, "Basil")


def _membership(chat, agent) -> ChatAgent:
    db.session.expire_all()
    return db.session.scalar(
        sa.select(ChatAgent).where(ChatAgent.chat_id == chat.id, ChatAgent.agent_id == agent.id)
    )


def _summary_jobs() -> list[tuple]:
    return [tuple(job.args) for job in rq_queue().get_jobs() if job.func_name.endswith(".summarize")]


def _conversation(admin, agents, title="Garden", messages=2):
    chat = factories.chat(admin.account, agents, title)
    for i in range(messages):
        factories.message(chat, f"message {i}", author=admin if i % 2 == 0 else agents[0])
    return chat


# ChatAgent: the debounce and the borrowed context


@time_machine.travel(NOW, tick=False)
def test_summary_is_stale_without_a_summary_or_after_five_minutes(admin, ada):
    chat = factories.chat(admin.account, [ada])
    membership = _membership(chat, ada)
    assert membership.summary_stale()

    factories.summary(chat, ada, "Fresh.", generated_at=utcnow() - timedelta(minutes=4, seconds=59))
    assert not _membership(chat, ada).summary_stale()

    factories.summary(chat, ada, "Old.", generated_at=utcnow() - timedelta(minutes=5, seconds=1))
    assert _membership(chat, ada).summary_stale()


def test_clear_borrowed_context_clears_what_was_included(admin, ada):
    chat = factories.chat(admin.account, [ada])
    staged = {"source_conversation_id": "x", "messages": [], "staged_at": "2026-11-21T12:00:00.000001"}
    factories.summary(chat, ada, "s", borrowed_context_json=staged)

    assert _membership(chat, ada).clear_borrowed_context(staged) is True
    db.session.commit()

    assert _membership(chat, ada).borrowed_context_json is None


def test_clear_borrowed_context_is_a_no_op_without_context(admin, ada):
    chat = factories.chat(admin.account, [ada])
    membership = _membership(chat, ada)

    with count_queries() as counted:
        assert membership.clear_borrowed_context(None) is False

    assert counted.count == 0
    assert _membership(chat, ada).borrowed_context_json is None


def test_clear_borrowed_context_keeps_context_staged_since(admin, ada):
    chat = factories.chat(admin.account, [ada])
    included = {"source_conversation_id": "x", "messages": [], "staged_at": "2026-11-21T12:00:00.000001"}
    newer = {**included, "staged_at": "2026-11-21T12:00:03.000001"}
    factories.summary(chat, ada, "s", borrowed_context_json=newer)

    assert _membership(chat, ada).clear_borrowed_context(included) is False
    db.session.commit()

    assert _membership(chat, ada).borrowed_context_json == newer


# other_conversation_summaries


@time_machine.travel(NOW, tick=False)
def test_other_conversation_summaries_lists_the_other_active_chats_newest_first(admin, ada):
    here = factories.chat(admin.account, [ada], "Here")
    older = factories.chat(admin.account, [ada], "Older", manual=False)
    newer = factories.chat(admin.account, [ada], "Newer", manual=False)
    factories.summary(here, ada, "This chat.")
    factories.summary(older, ada, "Older state.")
    factories.summary(newer, ada, "Newer state.")
    older.last_message_at = utcnow() - timedelta(hours=2)
    newer.last_message_at = utcnow() - timedelta(hours=1)
    db.session.commit()

    rows = other_conversation_summaries(ada, exclude_chat_id=here.id, heard=chats_heard_in(here))

    assert [(r.chat.title, r.agent_summary) for r in rows] == [
        ("Newer", "Newer state."),
        ("Older", "Older state."),
    ]


@time_machine.travel(NOW, tick=False)
def test_other_conversation_summaries_leaves_out_old_discarded_and_blank(admin, ada):
    here = factories.chat(admin.account, [ada], "Here")
    kept = factories.chat(admin.account, [ada], "Kept")
    stale = factories.chat(admin.account, [ada], "Seven hours ago")
    discarded = factories.chat(admin.account, [ada], "Discarded")
    blank = factories.chat(admin.account, [ada], "Blank")
    never = factories.chat(admin.account, [ada], "Never summarized")
    for chat in (kept, stale, discarded):
        factories.summary(chat, ada, f"About {chat.title}.")
    factories.summary(blank, ada, "   ")
    stale.last_message_at = utcnow() - timedelta(hours=6, minutes=1)
    discarded.discarded_at = utcnow()
    db.session.commit()

    rows = other_conversation_summaries(ada, exclude_chat_id=here.id, heard=chats_heard_in(here))

    assert [r.chat.title for r in rows] == ["Kept"]
    assert never.id not in {r.chat_id for r in rows}


def test_other_conversation_summaries_are_at_most_ten_in_one_query(admin, ada):
    here = factories.chat(admin.account, [ada], "Here")
    for i in range(12):
        factories.summary(factories.chat(admin.account, [ada], f"Chat {i}"), ada, f"Summary {i}.")
    here_id, _ = here.id, ada.account_id  # load both before counting
    heard = chats_heard_in(here)

    with count_queries() as counted:
        rows = other_conversation_summaries(ada, exclude_chat_id=here_id, heard=heard)
        titles = [r.chat.title for r in rows]

    assert counted.count == 1
    assert titles == [f"Chat {i}" for i in range(11, 1, -1)]


def test_an_agent_never_sees_a_chat_it_is_not_in_nor_another_accounts(admin, ada, basil, stranger):
    here = factories.chat(admin.account, [ada], "Here")
    basils = factories.chat(admin.account, [basil], "Basil alone")
    factories.summary(basils, basil, "Basil's secret.")
    # A chat of another account that (by a data error) holds Ada: still never shown to her.
    foreign = factories.chat(stranger.account, [ada, factories.agent(stranger.account, "Mallory")], "Globex")
    factories.summary(foreign, ada, "Globex plans.")

    assert other_conversation_summaries(ada, exclude_chat_id=here.id, heard=chats_heard_in(here)) == []


# The summary job


@time_machine.travel(NOW, tick=False)
def test_the_job_summarizes_the_last_ten_messages_with_identity_first(app, fake_llm, admin, ada):
    chat = factories.chat(admin.account, [ada], "Roses")
    for i in range(12):
        factories.message(chat, f"m{i} " + "x" * 600, author=admin if i % 2 == 0 else ada)
    factories.message(chat, "", author=ada, status="failed")
    fake_llm.reply("Choosing shade roses.\nPending: Dana's soil test.")

    counts = summarize(chat.id, ada.id)

    assert counts == {"summarized": 1, "messages": 10}
    request = fake_llm.requests[-1]
    assert request["model"] == "ada-model" and "tools" not in request
    system, user = request["messages"]
    assert system["role"] == "system" and system["content"].startswith(
        "Your identity:\nYou are Ada, a gardener.\n\nSummarize this conversation for your own reference."
    )
    assert "previous summary" not in system["content"]
    assert user["content"].startswith('Conversation: "Roses"\n\nRecent messages:\n\n- dana: m2 ')
    lines = user["content"].split("\n")[4:]
    assert len(lines) == 10 and lines[-1].startswith("- Ada: m11 ")
    assert all(len(line) == len("- dana: ") + 500 or len(line) == len("- Ada: ") + 500 for line in lines)
    membership = _membership(chat, ada)
    assert membership.agent_summary == "Choosing shade roses.\nPending: Dana's soil test."
    assert membership.agent_summary_generated_at == utcnow()
    call = db.session.scalar(sa.select(LlmCall))
    assert (call.purpose, call.agent_id, call.chat_id, call.status) == ("summarize", ada.id, chat.id, "ok")
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "summarize"))
    assert (run.job_type, run.status, run.target, run.account_id) == (
        "summarize",
        "done",
        f"chat:{chat.id} agent:{ada.id}",
        admin.account_id,
    )


def test_the_job_updates_the_previous_summary_with_the_configured_model(app, fake_llm, admin, ada):
    app.config["SUMMARY_MODEL_ID"] = "light-model"
    chat = _conversation(admin, [ada])
    factories.summary(chat, ada, "Old line one.\nOld line two.", generated_at=utcnow() - timedelta(hours=1))
    fake_llm.reply("New state.")

    summarize(chat.id, ada.id)

    request = fake_llm.requests[-1]
    assert request["model"] == "light-model"
    assert (
        "Your previous summary of this conversation:\nOld line one.\nOld line two.\n\n"
        "Update this summary based on the latest messages. Keep exactly 2 lines."
    ) in request["messages"][0]["content"]
    assert _membership(chat, ada).agent_summary == "New state."


def test_the_job_skips_a_fresh_summary(app, fake_llm, admin, ada):
    chat = _conversation(admin, [ada])
    factories.summary(chat, ada, "Fresh.", generated_at=utcnow() - timedelta(minutes=2))

    assert summarize(chat.id, ada.id) == {"summarized": 0, "fresh": 1}
    assert fake_llm.requests == []
    assert _membership(chat, ada).agent_summary == "Fresh."


def test_the_job_skips_a_chat_with_fewer_than_two_messages(app, fake_llm, admin, ada):
    chat = _conversation(admin, [ada], messages=1)

    assert summarize(chat.id, ada.id) == {"summarized": 0, "too_few_messages": 1}
    assert fake_llm.requests == []
    assert _membership(chat, ada).agent_summary is None


def test_the_job_skips_discarded_chats_paused_agents_and_departed_agents(app, fake_llm, admin, ada, basil):
    discarded = _conversation(admin, [ada])
    discarded.discarded_at = utcnow()
    paused = factories.agent(admin.account, "Zed", paused=True)
    with_paused = _conversation(admin, [paused])
    db.session.commit()

    assert summarize(discarded.id, ada.id) == {"summarized": 0, "skipped": 1}
    assert summarize(with_paused.id, paused.id) == {"summarized": 0, "skipped": 1}
    assert summarize(with_paused.id, basil.id) == {"summarized": 0, "skipped": 1}
    assert fake_llm.requests == []


def test_an_llm_failure_keeps_the_old_summary_and_is_logged_and_recorded(
    app, fake_llm, admin, ada, caplog, monkeypatch
):
    # Alembic's fileConfig, run by the session's migration fixture, disables loggers that existed before it.
    monkeypatch.setattr(logging.getLogger("webapp.jobs.summaries"), "disabled", False)
    chat = _conversation(admin, [ada])
    earlier = utcnow() - timedelta(hours=1)
    factories.summary(chat, ada, "Still true.", generated_at=earlier)
    fake_llm.fail(400, "model not found")

    with caplog.at_level(logging.WARNING), pytest.raises(LLMError):
        summarize(chat.id, ada.id)

    membership = _membership(chat, ada)
    assert (membership.agent_summary, membership.agent_summary_generated_at) == ("Still true.", earlier)
    assert f"Agent summary failed for chat={chat.id} agent={ada.id}" in caplog.text
    run = db.session.scalar(sa.select(JobRun).where(JobRun.job_type == "summarize"))
    assert (run.status, run.error) == ("failed", "The model returned HTTP 400: model not found")
    call = db.session.scalar(sa.select(LlmCall))
    assert (call.purpose, call.status) == ("summarize", "error")


def test_a_failing_summary_job_fails_quietly_in_the_worker(app, fake_llm, admin, ada):
    app.config["JOB_MAX_RETRIES"] = 0
    chat = _conversation(admin, [ada])
    factories.summary(chat, ada, "Still true.", generated_at=utcnow() - timedelta(hours=1))
    from webapp.jobs.queue import enqueue

    enqueue(summarize, chat.id, ada.id)
    db.session.commit()
    fake_llm.fail(503, "overloaded")

    SimpleWorker([rq_queue()], connection=app.extensions["redis"]).work(burst=True)

    assert _membership(chat, ada).agent_summary == "Still true."
    assert [
        r.status for r in db.session.scalars(sa.select(JobRun).where(JobRun.job_type == "summarize"))
    ] == ["failed"]


def test_an_empty_answer_keeps_the_old_summary(app, fake_llm, admin, ada):
    chat = _conversation(admin, [ada])
    factories.summary(chat, ada, "Still true.", generated_at=utcnow() - timedelta(hours=1))
    fake_llm.reply("  \n ")

    with pytest.raises(LLMError, match="finished without writing anything"):
        summarize(chat.id, ada.id)  # retryable, and recorded as such
    assert _membership(chat, ada).agent_summary == "Still true."
    assert db.session.scalar(sa.select(LlmCall.status)) == "error"


def test_a_summary_is_at_most_two_lines_and_500_characters():
    assert clean_summary("\n  First   line \n\n Second line\nThird line\n") == "First line\nSecond line"
    long = clean_summary("word " * 200)
    assert len(long) == 500 and long.endswith("…") and "\n" not in long
    assert clean_summary("   ") == ""


# What enqueues the job


def test_a_user_message_enqueues_summaries_only_for_stale_agents(client, auth, admin, ada, basil):
    auth.login(admin)
    chat = factories.chat(admin.account, [ada, basil], "Plans")
    factories.summary(chat, ada, "Fresh.", generated_at=utcnow() - timedelta(minutes=1))
    factories.summary(chat, basil, "Old.", generated_at=utcnow() - timedelta(minutes=6))

    client.post(f"/chats/{chat.id}/messages", data={"content": "Any news?"})

    assert _summary_jobs() == [(chat.id, basil.id)]


def test_four_agents_with_fresh_summaries_enqueue_no_job_on_a_new_message(client, auth, admin):
    auth.login(admin)
    agents = [factories.agent(admin.account, name) for name in ("Ada", "Basil", "Cleo", "Dev")]
    chat = factories.chat(admin.account, agents, "Four")
    for agent in agents:
        factories.summary(chat, agent, "Fresh.", generated_at=utcnow() - timedelta(minutes=2))

    response = client.post(f"/chats/{chat.id}/messages", data={"content": "Thoughts, anyone?"})

    assert response.status_code == 200
    assert [j for j in rq_queue().get_jobs() if j.func_name.endswith(".summarize")] == []


def test_a_finished_reply_enqueues_summaries_for_stale_agents(app, fake_llm, admin, ada, basil):
    chat = factories.chat(admin.account, [ada, basil], "Plans")
    factories.message(chat, "Hello both", author=admin)
    factories.summary(chat, basil, "Fresh.", generated_at=utcnow() - timedelta(minutes=1))
    [reply] = request_replies(chat, [ada])
    db.session.commit()

    respond([reply.id])

    assert _summary_jobs() == [(chat.id, ada.id)]


def test_a_failed_reply_enqueues_no_summary(app, fake_llm, admin, ada):
    chat = factories.chat(admin.account, [ada], "Plans")
    factories.message(chat, "Hello", author=admin)
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    fake_llm.fail(400, "bad request")

    with pytest.raises(Exception, match="replies failed"):
        respond([reply.id])

    assert _summary_jobs() == []


# flask summaries backfill


@pytest.fixture
def backfill_chats(admin, ada, basil):
    missing = _conversation(admin, [ada, basil], "Missing")
    done = _conversation(admin, [ada], "Done")
    factories.summary(done, ada, "Already summarized.")
    old = _conversation(admin, [ada], "Old")
    old.last_message_at = utcnow() - timedelta(hours=7)
    db.session.commit()
    return missing


def test_backfill_enqueues_a_job_per_missing_summary_of_active_chats(runner, backfill_chats, ada, basil):
    result = runner.invoke(args=["summaries", "backfill"])

    assert result.exit_code == 0, result.output
    assert "2 missing summaries: enqueued 2 jobs." in result.output
    assert sorted(_summary_jobs()) == sorted([(backfill_chats.id, ada.id), (backfill_chats.id, basil.id)])


def test_backfill_for_one_agent_inline(runner, fake_llm, backfill_chats, ada, basil):
    fake_llm.reply("Basil's view.")

    result = runner.invoke(args=["summaries", "backfill", "--agent", str(basil.id), "--now"])

    assert result.exit_code == 0, result.output
    assert "1 missing summaries: 1 generated, 0 skipped, 0 failed." in result.output
    assert _membership(backfill_chats, basil).agent_summary == "Basil's view."
    assert _membership(backfill_chats, ada).agent_summary is None
    assert [j for j in rq_queue().get_jobs() if j.func_name.endswith(".summarize")] == []


def test_backfill_inline_counts_failures_and_goes_on(runner, fake_llm, backfill_chats, ada, basil):
    fake_llm.fail(400, "bad model")
    fake_llm.reply("Basil's view.")

    result = runner.invoke(args=["summaries", "backfill", "--now"])

    assert "2 missing summaries: 1 generated, 0 skipped, 1 failed." in result.output
    assert "HTTP 400: bad model" in result.output


def test_backfill_refuses_an_unknown_agent(runner, backfill_chats):
    result = runner.invoke(args=["summaries", "backfill", "--agent", "999999"])

    assert result.exit_code != 0 and "No agent with id 999999." in result.output


def test_one_pending_summary_per_chat_and_agent_whatever_the_number_of_messages(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada], "Busy")

    for i in range(5):
        client.post(f"/chats/{chat.id}/messages", data={"content": f"message {i}"})

    assert _summary_jobs() == [(chat.id, ada.id)]
    queued = db.session.scalars(sa.select(JobRun.status).where(JobRun.job_type == "summarize")).all()
    assert queued == ["queued"]
