"""Issue 14.4: where every memory came from, and what every reply's prompt held."""

import json
import re
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.refinement import refine_agent
from webapp.jobs.reflection import reflect_agent
from webapp.jobs.replies import request_replies, respond
from webapp.models import AgentMemory, AuditLog, ReplySources
from webapp.timeutil import utcnow


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "recall"])


@pytest.fixture
def chat(admin, ada):
    chat = factories.chat(admin.account, [ada], "Roses")
    factories.message(chat, "Remember my roses are climbers.", author=admin)
    return chat


def _reply(chat, ada, fake_llm, *answers):
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    for answer in answers:
        fake_llm.reply(**answer) if isinstance(answer, dict) else fake_llm.reply(answer)
    respond([reply.id])
    db.session.expire_all()
    return reply


def test_a_replys_sources_list_exactly_the_memories_its_prompt_held(app, fake_llm, chat, ada):
    core = factories.memory(ada, "I am a patient gardener.")
    fresh = factories.memory(ada, "The user's roses are climbers.", "journal")
    factories.memory(ada, "An old note.", "journal", created_at=utcnow() - timedelta(days=30))  # expired
    gone = factories.memory(ada, "A deleted memory.")
    gone.soft_delete()
    db.session.commit()

    reply = _reply(chat, ada, fake_llm, "Climbers, noted.")

    sources = db.session.get(ReplySources, reply.id)
    assert sources.memory_ids == [fresh.id, core.id]  # in the prompt's order: what matches the chat first
    prompt = fake_llm.requests[-1]["messages"][-1]["content"]
    assert all(m.content in prompt for m in (core, fresh))


def test_a_deleted_memorys_use_is_still_shown_to_admins_and_hidden_from_members(
    app, client, auth, admin, member, fake_llm, chat, ada
):
    used = factories.memory(ada, "The user's roses are climbers.")
    reply = _reply(chat, ada, fake_llm, "Climbers, noted.")
    db.session.get(AgentMemory, used.id).soft_delete()
    db.session.commit()

    auth.login(admin)
    page = client.get(f"/chats/{chat.id}").text
    assert "used 1 memory" in page
    details = client.get(f"/admin/replies/{reply.id}/sources").text
    assert f"#{used.id}</a> The user&#39;s roses are climbers." in details and "deleted since" in details

    client.post("/logout")
    auth.login(member)
    page = client.get(f"/chats/{chat.id}").text
    assert "memor" not in re.search(rf'<article id="message-{reply.id}".*?</article>', page, re.S).group(0)
    assert client.get(f"/admin/replies/{reply.id}/sources").status_code in (403, 404)


def test_another_accounts_admin_cannot_read_a_replys_sources(
    app, client, auth, stranger, fake_llm, chat, ada
):
    factories.memory(ada, "Secret of Acme.")
    reply = _reply(chat, ada, fake_llm, "ok")
    auth.login(stranger)
    assert client.get(f"/admin/replies/{reply.id}/sources").status_code == 404


def test_recalled_memories_are_part_of_the_replys_sources(app, client, signed_in, fake_llm, chat, ada):
    old = factories.memory(
        ada, "The user's dog is Biscuit.", "journal", created_at=utcnow() - timedelta(days=40)
    )
    reply = _reply(chat, ada, fake_llm, {"tool_calls": [("recall", {"query": "dog"})]}, "Biscuit!")

    sources = db.session.get(ReplySources, reply.id)
    assert sources.recalled_memory_ids == [old.id] and old.id not in sources.memory_ids
    assert "used 1 memory" in client.get(f"/chats/{chat.id}").text


def test_the_ledger_shows_where_each_memory_came_from(app, client, signed_in, admin, fake_llm, ada):
    basil = factories.agent(admin.account, "Basil")
    group = factories.chat(admin.account, [ada, basil], "Garden club")
    with time_machine.travel(utcnow() - timedelta(hours=7), tick=False):
        first = factories.message(group, "I planted climbers by the wall.", author=admin)
        last = factories.message(group, "They flower in June.", author=admin)
    fake_llm.reply(json.dumps({"journal": ["The user planted climbers."], "core": []}), model="ada-model")
    consolidate_chat(group.id)
    saved = _reply(group, ada, fake_llm, {"tool_calls": [("save_memory", {"content": "Climbers flower in June.",
                                                                          "memory_type": "core"})]}, "Saved.")  # fmt: skip
    client.post(f"/admin/agents/{ada.id}/memories", data={"content": "Added by hand.", "memory_type": "core"})

    page = client.get(f"/admin/agents/{ada.id}/memories").text

    def origin(text: str) -> str:
        row = re.search(
            rf'<article id="memory-\d+"[^>]*>\s*<p class="content">{text}</p>.*?</article>', page, re.S
        )
        return " ".join(re.search(r'<p class="origin muted">(.*?)</p>', row.group(0), re.S).group(1).split())

    assert origin("The user planted climbers.") == (
        f'From <a href="/chats/{group.id}#message-{first.id}">Garden club</a>, messages #{first.id}–#{last.id} '
        "(consolidation)."
    )
    assert origin("Climbers flower in June.") == (
        f'Saved by the agent with save_memory in <a href="/chats/{group.id}#message-{saved.id}">Garden club</a>, '
        f"reply #{saved.id}."
    )
    assert origin("Added by hand.") == "Added by dana@example.com."


@pytest.mark.parametrize("setting", ["prompt", "core", "none"])
def test_whatever_members_may_see_of_the_memory_a_replys_sources_show_them_none_of_it(
    app, client, auth, member, fake_llm, chat, ada, setting
):
    ada.members_see_memory = setting
    used = factories.memory(ada, "The user's roses are climbers.")
    recalled = factories.memory(
        ada, "The user's dog is Biscuit.", "journal", created_at=utcnow() - timedelta(days=40)
    )
    reply = _reply(chat, ada, fake_llm, {"tool_calls": [("recall", {"query": "dog"})]}, "Noted.")
    assert db.session.get(ReplySources, reply.id).memory_count == 2
    auth.login(member)

    page = client.get(f"/chats/{chat.id}").text

    article = re.search(rf'<article id="message-{reply.id}".*?</article>', page, re.S).group(0)
    provenance = re.search(r'<details class="provenance.*?</details>', article, re.S)
    assert provenance is None or "memor" not in provenance.group(0)
    assert used.content not in page and recalled.content not in page and "user&#39;s" not in page
    assert client.get(f"/admin/replies/{reply.id}/sources").status_code in (403, 404)


def test_the_ledger_shows_a_promotion_by_reflection_and_a_memory_written_by_refinement(
    app, client, signed_in, fake_llm, ada
):
    client.post(
        f"/admin/agents/{ada.id}/memories", data={"content": "Dana waters at dawn.", "memory_type": "journal"}
    )
    fake_llm.reply(json.dumps({"promote": [1]}), model="ada-model")
    reflect_agent(ada.id)
    first, second = factories.memory(ada, "Dana likes tea."), factories.memory(ada, "Dana likes green tea.")
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "consolidate", "ids": f"{first.id},{second.id}",
                                                  "content": "Dana drinks green tea, never black."})])  # fmt: skip
    fake_llm.reply(tool_calls=[("refine_memory", {"action": "complete", "summary": "merged the teas"})])
    refinement = refine_agent(ada.id, force=True)["session_id"]
    reflection = db.session.scalar(sa.select(AuditLog.session_id).where(AuditLog.action == "memory_promote"))

    page = client.get(f"/admin/agents/{ada.id}/memories").text

    def origin(text: str) -> str:
        row = re.search(
            rf'<article id="memory-\d+"[^>]*>\s*<p class="content">{text}</p>.*?</article>', page, re.S
        )
        return " ".join(re.search(r'<p class="origin muted">(.*?)</p>', row.group(0), re.S).group(1).split())

    assert origin("Dana waters at dawn.") == (
        f'Added by dana@example.com. Promoted to core by <a href="/admin/sessions/{reflection}">reflection '
        f"{reflection[:8]}</a>."
    )
    assert origin("Dana drinks green tea, never black.") == (
        f'Written by <a href="/admin/sessions/{refinement}">refinement session {refinement[:8]}</a>.'
    )
