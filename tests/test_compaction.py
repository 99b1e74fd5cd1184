"""Spec 004: old history is summarized into the chat's memory_doc by a job; messages are never changed."""

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.compaction import compact_chat, compact_if_needed
from webapp.jobs.queue import rq_queue
from webapp.llm import LLMError
from webapp.models import Chat, LlmCall, Message


@pytest.fixture
def chat(admin):
    ada = factories.agent(admin.account, "Ada")
    return factories.chat(admin.account, [ada], "Long talk")


def _fill(chat, author, count: int) -> list[Message]:
    rows = [
        chat.add_message(role="user", content=f"msg {i}", user=author, status="done") for i in range(count)
    ]
    db.session.commit()
    return rows


def _snapshot(chat) -> list[tuple]:
    db.session.expire_all()
    rows = db.session.scalars(sa.select(Message).where(Message.chat_id == chat.id).order_by(Message.id))
    return [(m.id, m.role, m.content, m.status, m.created_at, m.updated_at) for m in rows]


def test_the_settings_have_the_specs_defaults(app):
    assert (app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"]) == (100, 20)


def test_not_triggered_below_the_threshold(app, chat, admin, fake_llm):
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 10, 3
    _fill(chat, admin, 5)

    assert compact_if_needed(chat) is False
    assert compact_chat(chat.id)["skipped"] == "under the threshold"
    assert db.session.get(Chat, chat.id).memory_doc == "" and fake_llm.requests == []


def test_triggered_above_the_threshold_summarizes_all_but_the_recent(app, chat, admin, fake_llm):
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 5, 2
    rows = _fill(chat, admin, 6)
    before = _snapshot(chat)
    fake_llm.reply("- Summary: talked about Python.")

    assert compact_if_needed(chat) is True
    assert compact_if_needed(chat) is False  # one pending compaction is enough
    db.session.commit()
    assert [
        j.func_name.rsplit(".", 1)[1] for j in rq_queue().get_jobs() if "embeddings" not in j.func_name
    ] == ["compact_chat"]
    counts = compact_chat(chat.id)

    compacted = db.session.get(Chat, chat.id)
    assert counts == {"summarized": 4, "kept": 2, "raced": 0}
    assert "- Summary: talked about Python." in compacted.memory_doc
    assert compacted.memory_doc.startswith("## Through ")
    assert compacted.compacted_through_message_id == rows[3].id
    request = fake_llm.requests[-1]
    assert request["messages"][0]["content"].startswith("You are summarizing a conversation segment")
    assert request["messages"][1]["content"] == "\n".join(f"dana: msg {i}" for i in range(4))
    assert request["model"] == "ada-model"
    assert _snapshot(chat) == before  # messages are never modified or deleted
    assert db.session.scalar(sa.select(LlmCall.purpose)) == "compact"


def test_appends_to_an_existing_memory_doc(app, chat, admin, fake_llm):
    chat.memory_doc = "# Existing\nUser likes cats."
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 3, 1
    _fill(chat, admin, 4)
    fake_llm.reply("Summary: discussed dogs.")

    compact_chat(chat.id)

    doc = db.session.get(Chat, chat.id).memory_doc
    assert doc.startswith("# Existing\nUser likes cats.\n\n## Through ")
    assert doc.endswith("Summary: discussed dogs.")


def test_the_next_compaction_starts_after_the_cut(app, chat, admin, fake_llm):
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 3, 1
    _fill(chat, admin, 4)
    compact_chat(chat.id)
    _fill(chat, admin, 3)
    fake_llm.requests.clear()

    compact_chat(chat.id)

    assert fake_llm.requests[-1]["messages"][1]["content"] == "dana: msg 3\ndana: msg 0\ndana: msg 1"
    assert db.session.get(Chat, chat.id).memory_doc.count("## Through") == 2


def test_a_failed_summary_changes_nothing_and_is_retried(app, chat, admin, fake_llm):
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 3, 1
    _fill(chat, admin, 4)
    fake_llm.fail(503, "down")

    with pytest.raises(LLMError) as raised:
        compact_chat(chat.id)

    assert raised.value.retryable
    compacted = db.session.get(Chat, chat.id)
    assert (compacted.memory_doc, compacted.compacted_through_message_id) == ("", None)


def test_global_settings_apply_without_overrides(app, chat, admin, fake_llm):
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 4, 2
    _fill(chat, admin, 5)

    assert compact_chat(chat.id) == {"summarized": 3, "kept": 2, "raced": 0}


# The prompt after compaction


def test_the_prompt_holds_the_summary_and_only_messages_after_the_cut(app, chat, admin, fake_llm):
    from webapp.prompting.build import build_prompt

    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 3, 1
    _fill(chat, admin, 4)
    fake_llm.reply("- Dana counted to three.")
    compact_chat(chat.id)
    db.session.expire_all()
    chat = db.session.get(Chat, chat.id)

    messages = build_prompt(chat, chat.agents[0]).messages

    assert messages[1]["role"] == "system" and messages[1]["content"].startswith(
        "# Conversation so far\n\n## Through"
    )
    assert "- Dana counted to three." in messages[1]["content"]
    assert [m["content"] for m in messages[2:-1]] == ["dana: msg 3"]


def test_compaction_never_runs_on_the_reply_path(app, chat, admin, fake_llm):
    from webapp.jobs.replies import request_replies, respond

    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 5, 2
    _fill(chat, admin, 8)
    [reply] = request_replies(chat, chat.agents)
    db.session.commit()
    fake_llm.reply("A reply.")

    respond([reply.id])

    assert db.session.scalars(sa.select(LlmCall.purpose)).all() == ["reply"]
    assert "compact_chat" in [j.func_name.rsplit(".", 1)[1] for j in rq_queue().get_jobs()]
    assert db.session.get(Chat, chat.id).memory_doc == ""


def test_sending_a_message_past_the_threshold_queues_a_compaction(app, client, auth, admin, chat):
    auth.login(admin)
    app.config["COMPACTION_THRESHOLD"] = 3
    _fill(chat, admin, 3)

    client.post(f"/chats/{chat.id}/messages", data={"content": "one more"})

    assert "compact_chat" in [j.func_name.rsplit(".", 1)[1] for j in rq_queue().get_jobs()]


@pytest.mark.parametrize("size", [100, 1_000, 10_000])
def test_prompt_input_stays_bounded_however_long_the_chat(app, chat, admin, size):
    from webapp.prompting.build import build_prompt
    from webapp.timeutil import utcnow
    from webapp.tokens import count_tokens

    now = utcnow()
    rows = [
        {"chat_id": chat.id, "role": "user", "user_id": admin.id, "content": f"message {i} " + "about roses " * 20,
         "status": "done", "created_at": now, "updated_at": now}
        for i in range(size)
    ]  # fmt: skip
    db.session.execute(sa.insert(Message), rows)
    db.session.commit()

    tokens = sum(count_tokens(m["content"]) for m in build_prompt(chat, chat.agents[0]).messages)

    assert tokens <= app.config["TRANSCRIPT_TOKEN_BUDGET"] + 500


# The chat page


def test_the_chat_page_marks_the_cut_and_shows_the_summary(app, client, auth, admin, chat, fake_llm):
    auth.login(admin)
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 3, 1
    _fill(chat, admin, 4)
    fake_llm.reply("- Dana counted **to three**.")
    compact_chat(chat.id)

    page = client.get(f"/chats/{chat.id}").text.split('id="messages"')[1]  # the pane, not the chat list

    assert page.index("msg 2") < page.index("Everything above is summarized") < page.index("msg 3")
    assert "Dana counted <strong>to three</strong>." in page and "Edit summary" in page


def test_an_admin_edits_the_summary_and_the_edit_is_audited(app, client, auth, admin, chat):
    from webapp.models import AuditLog

    auth.login(admin)
    chat.memory_doc = "old summary"
    db.session.commit()

    form = client.get(f"/chats/{chat.id}/memory-doc?edit=1", headers={"HX-Request": "true"})
    saved = client.post(f"/chats/{chat.id}/memory-doc", data={"memory_doc": "<b>new</b> summary"})
    too_long = client.post(f"/chats/{chat.id}/memory-doc", data={"memory_doc": "x" * 100_001})

    assert "<textarea" in form.text and "old summary" in form.text
    assert saved.status_code == 200 and "&lt;b&gt;new&lt;/b&gt; summary" in saved.text
    assert too_long.status_code == 422 and "the limit is 100,000" in too_long.text
    db.session.expire_all()
    assert db.session.get(Chat, chat.id).memory_doc == "<b>new</b> summary"
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "chat_memory_doc_update"))
    assert (row.auditable_type, row.auditable_id, row.user_id) == ("Chat", chat.id, admin.id)
    assert row.data["before"] == {"memory_doc": "old summary"} and row.data["after"] == {
        "memory_doc": "<b>new</b> summary"
    }


def test_members_read_but_cannot_edit_the_summary(app, client, auth, member, chat):
    auth.login(member)

    assert "Edit summary" not in client.get(f"/chats/{chat.id}").text
    assert client.post(f"/chats/{chat.id}/memory-doc", data={"memory_doc": "x"}).status_code == 403


def test_another_accounts_summary_is_not_found(app, client, auth, stranger, chat):
    auth.login(stranger)

    assert client.get(f"/chats/{chat.id}/memory-doc").status_code == 404
    assert client.post(f"/chats/{chat.id}/memory-doc", data={"memory_doc": "x"}).status_code == 404


def test_a_long_backlog_is_summarized_a_batch_at_a_time(app, chat, admin, fake_llm):
    from webapp.tokens import count_tokens

    app.config["COMPACTION_MAX_INPUT_TOKENS"] = sum(count_tokens(f"dana: msg {i}") for i in range(3))
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 3, 1
    _fill(chat, admin, 10)

    counts = compact_chat(chat.id)  # one job works through the backlog, one bounded request at a time

    assert counts == {"summarized": 9, "kept": 1, "raced": 0, "batches": 3}
    assert fake_llm.requests[0]["messages"][1]["content"] == "dana: msg 0\ndana: msg 1\ndana: msg 2"
    assert db.session.get(Chat, chat.id).memory_doc.count("## Through") == 3


def test_only_the_newest_summary_sections_within_budget_reach_the_prompt(app, chat):
    from webapp.prompting.build import build_prompt

    app.config["MEMORY_DOC_PROMPT_TOKENS"] = 40
    chat.memory_doc = "\n\n".join(f"## Through day {i}\n\n- " + "fact " * 15 for i in range(10))
    db.session.commit()

    summary = build_prompt(chat, chat.agents[0]).messages[1]["content"]

    assert summary.startswith("# Conversation so far\n\n(Older parts of this summary are left out.)")
    assert "day 9" in summary and "day 0" not in summary
