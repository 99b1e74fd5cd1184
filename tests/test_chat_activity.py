"""A chat's activity is its last message: consolidation and compaction write the chat without making it recent
again (the chat list, the consolidation finder and the agents' other-conversations window)."""

import json
import re
from datetime import timedelta

import pytest
import time_machine

from tests import factories
from webapp.extensions import db
from webapp.jobs.compaction import compact_chat
from webapp.jobs.consolidation import consolidate_chat, consolidate_stale_chats
from webapp.jobs.queue import rq_queue
from webapp.models import Chat
from webapp.prompting.build import build_prompt
from webapp.timeutil import utcnow


def _hours_ago(hours: float):
    return time_machine.travel(utcnow() - timedelta(hours=hours), tick=False)


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada")


@pytest.fixture
def basil(admin):
    return factories.agent(admin.account, "Basil")


@pytest.fixture
def idle(admin, ada, basil):
    """A group chat whose last message is 9 hours old, with Ada's summary of it."""
    chat = factories.chat(admin.account, [ada, basil], "Idle garden talk")
    with _hours_ago(9):
        for i in range(6):
            factories.message(chat, f"Old message {i}", author=admin)
    link = next(link for link in chat.chat_agents if link.agent_id == ada.id)
    link.agent_summary, link.agent_summary_generated_at = "Roses and their pests.", utcnow()
    db.session.commit()
    return chat


@pytest.fixture
def recent(admin, ada, basil):
    chat = factories.chat(admin.account, [ada, basil], "Recent plans")
    with _hours_ago(2):
        factories.message(chat, "A newer message", author=admin)
    return chat


def _listed_titles(client) -> list[str]:
    return re.findall(r'class="chat-title">([^<]+)</span>', client.get("/chats/").text)


def test_a_consolidation_leaves_the_chat_list_order_alone(client, signed_in, idle, recent, fake_llm):
    assert _listed_titles(client) == ["Recent plans", "Idle garden talk"]
    fake_llm.reply(json.dumps({"journal": ["Dana grows roses."], "core": []}))

    consolidate_chat(idle.id)

    db.session.expire_all()
    assert db.session.get(Chat, idle.id).last_consolidated_at is not None
    assert _listed_titles(client) == ["Recent plans", "Idle garden talk"]
    assert (
        f'datetime="{idle.last_message_at.isoformat()}Z"' in client.get("/chats/").text
    )  # still its last message


def test_a_compaction_leaves_the_chat_list_order_alone(app, client, signed_in, idle, recent, fake_llm):
    app.config["COMPACTION_THRESHOLD"], app.config["COMPACTION_KEEP_RECENT"] = 4, 2
    fake_llm.reply("Dana talked about roses.")

    assert compact_chat(idle.id)["summarized"] == 4

    assert _listed_titles(client) == ["Recent plans", "Idle garden talk"]


def test_a_new_message_moves_a_chat_to_the_top(client, signed_in, idle, recent):
    factories.message(idle, "Back again", author=signed_in)

    assert _listed_titles(client) == ["Idle garden talk", "Recent plans"]


def test_consolidated_idle_chats_stay_out_of_other_conversations(idle, recent, ada, fake_llm):
    fake_llm.reply(json.dumps({"journal": [], "core": []}))

    consolidate_chat(idle.id)

    context = build_prompt(recent, ada).messages[-1]["content"]
    assert "Roses and their pests." not in context and "Idle garden talk" not in context


def test_the_finder_goes_by_the_last_message_not_by_writes_to_the_chat(idle, recent):
    idle.title = "Renamed just now"
    recent.memory_doc = "A summary written just now."
    db.session.commit()

    consolidate_stale_chats()

    queued = [job.args[0] for job in rq_queue().get_jobs() if job.func_name.endswith("consolidate_chat")]
    assert queued == [idle.id]


def test_a_chat_without_messages_is_listed_by_its_creation_and_never_consolidated(client, signed_in, ada):
    with _hours_ago(12):
        empty = factories.chat(signed_in.account, [ada], "Empty", manual=True)

    consolidate_stale_chats()

    assert rq_queue().get_jobs() == []
    assert _listed_titles(client) == ["Empty"] and empty.last_message_at < utcnow() - timedelta(hours=11)
