"""Spec 004: old history is summarized into the chat's memory_doc by a job; messages are never changed."""

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.compaction import compact_chat, compact_if_needed
from webapp.llm import LLMError
from webapp.models import Chat, LlmCall, Message
from webapp.queue import rq_queue


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
    chat.compaction_threshold, chat.compaction_keep_recent = 10, 3
    _fill(chat, admin, 5)

    assert compact_if_needed(chat) is False
    assert compact_chat(chat.id)["skipped"] == "under the threshold"
    assert db.session.get(Chat, chat.id).memory_doc == "" and fake_llm.requests == []


def test_triggered_above_the_threshold_summarizes_all_but_the_recent(app, chat, admin, fake_llm):
    chat.compaction_threshold, chat.compaction_keep_recent = 5, 2
    rows = _fill(chat, admin, 6)
    before = _snapshot(chat)
    fake_llm.reply("- Summary: talked about Python.")

    assert compact_if_needed(chat) is True
    assert compact_if_needed(chat) is False  # one pending compaction is enough
    db.session.commit()
    assert [j.func_name.rsplit(".", 1)[1] for j in rq_queue().get_jobs()] == ["compact_chat"]
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
    chat.compaction_threshold, chat.compaction_keep_recent = 3, 1
    _fill(chat, admin, 4)
    fake_llm.reply("Summary: discussed dogs.")

    compact_chat(chat.id)

    doc = db.session.get(Chat, chat.id).memory_doc
    assert doc.startswith("# Existing\nUser likes cats.\n\n## Through ")
    assert doc.endswith("Summary: discussed dogs.")


def test_the_next_compaction_starts_after_the_cut(app, chat, admin, fake_llm):
    chat.compaction_threshold, chat.compaction_keep_recent = 3, 1
    _fill(chat, admin, 4)
    compact_chat(chat.id)
    _fill(chat, admin, 3)
    fake_llm.requests.clear()

    compact_chat(chat.id)

    assert fake_llm.requests[-1]["messages"][1]["content"] == "dana: msg 3\ndana: msg 0\ndana: msg 1"
    assert db.session.get(Chat, chat.id).memory_doc.count("## Through") == 2


def test_a_failed_summary_changes_nothing_and_is_retried(app, chat, admin, fake_llm):
    chat.compaction_threshold, chat.compaction_keep_recent = 3, 1
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
