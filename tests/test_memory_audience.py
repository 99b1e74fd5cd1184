"""Issue 21.3: memory with an audience. What an agent remembers from a private chat is heard only where everyone
present may read that chat: a reply's prompt, recall, borrow_context, the other-conversations block, the step
labels, the jobs that write memories, and the ledger where admins widen or narrow who hears a memory."""

import json

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat
from webapp.jobs.reflection import reflect_agent
from webapp.jobs.replies import request_replies, respond
from webapp.llm.targets import for_agent
from webapp.models import AgentMemory, AuditLog, ChatAgent
from webapp.models.access import EVERYONE, Audience, memories_heard_in
from webapp.models.agents import DEFAULT_TOOLS
from webapp.models.audit import dedup_for_agent
from webapp.prompting.build import build_prompt, prompt_memory
from webapp.timeutil import utcnow
from webapp.tools import ToolContext
from webapp.tools import steps as tool_steps
from webapp.tools.borrow_context import borrow_context
from webapp.tools.recall import recall
from webapp.tools.refinement import RefinementSession
from webapp.tools.save_memory import save_memory

SECRET = "PLUM-7731"
TITLE = "Ayla notes 4417"
NOT_FOUND = {"error": "Conversation not found or you are not a participant"}


def _person(acme, name: str):
    person = factories.user(acme, f"{name.lower()}@example.com", "member")
    person.name = name
    db.session.commit()
    return person


@pytest.fixture
def ana(acme):
    return _person(acme, "Ana")


@pytest.fixture
def ben(acme):
    return _person(acme, "Ben")


@pytest.fixture
def ada(acme):
    return factories.agent(acme, "Ada", enabled_tools=list(DEFAULT_TOOLS))  # as the agent form sets them


@pytest.fixture
def anas_chat(acme, ana, ada, fake_llm):
    """Ana's private chat, in which she told Ada her locker code and Ada saved it with save_memory."""
    chat = factories.chat(acme, [ada], TITLE, people=[ana])
    save = ("save_memory", {"content": f"Ana's locker code is {SECRET}.", "memory_type": "core"})
    _ask(fake_llm, chat, ana, ada, f"My locker code is {SECRET}.", tool_calls=[save])
    factories.summary(chat, ada, f"Ana told me her locker code, {SECRET}.")
    return chat


def _ask(fake_llm, chat, person, agent, text: str, **answer) -> dict:
    """`person` says `text` in `chat` and `agent` replies (a tool call first, if given); the first request the
    model received."""
    factories.message(chat, text, author=person)
    [reply] = request_replies(chat, [agent])
    db.session.commit()
    fake_llm.requests.clear()
    if answer:
        fake_llm.reply(**answer)
    fake_llm.reply("Noted.")
    respond([reply.id])
    db.session.expire_all()
    return fake_llm.requests[0]


def _context(agent, chat) -> ToolContext:
    return ToolContext(
        agent=agent, chat=chat, message=factories.message(chat, "", author=agent, status="streaming")
    )


def _recalled(agent, chat, query: str) -> str:
    return json.dumps(recall(_context(agent, chat), query))


def _memory_section(request: dict) -> str:
    context = request["messages"][-1]["content"]
    return context[context.index("# Your memory") : context.index("# Now")]


def _heard_in(chat) -> set[str]:
    return set(db.session.scalars(sa.select(AgentMemory.content).where(memories_heard_in(chat))))


# save_memory, and who hears it


def test_a_memory_saved_in_a_private_chat_belongs_to_that_chat(anas_chat, ada):
    memory = db.session.scalar(sa.select(AgentMemory).where(AgentMemory.content.contains(SECRET)))

    assert (memory.chat_id, memory.audience) == (anas_chat.id, "chat")
    created = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_create"))
    assert created.data["chat_id"] == anas_chat.id and created.data["after"]["audience"] == "chat"


def test_bens_first_request_holds_none_of_anas_private_memories_summaries_or_messages(
    acme, anas_chat, ben, ada, fake_llm
):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])

    request = _ask(fake_llm, bens_chat, ben, ada, "What is the locker code?")

    sent = json.dumps(request)
    assert SECRET not in sent and TITLE not in sent and anas_chat.public_id not in sent
    assert "You have no memories yet." in _memory_section(request)


def test_recall_and_borrow_context_cannot_reach_anas_chat_from_bens(acme, anas_chat, ben, ada):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])
    factories.message(bens_chat, "Where is my locker?", author=ben)

    assert SECRET not in _recalled(ada, bens_chat, "locker code")
    assert borrow_context(_context(ada, bens_chat), anas_chat.public_id) == NOT_FOUND
    staged = db.session.scalar(
        sa.select(ChatAgent.borrowed_context_json).where(ChatAgent.chat_id == bens_chat.id)
    )
    assert staged is None


def test_step_labels_never_name_a_chat_not_heard_where_they_show(acme, anas_chat, ana, ben, ada):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])
    anas_other = factories.chat(acme, [ada], "Ana again", people=[ana])
    call = {"conversation_id": anas_chat.public_id}

    assert tool_steps.running("borrow_context", call, bens_chat)["label"] == "Reading another conversation…"
    chip = tool_steps.finished("borrow_context", call, {"message_count": 2}, bens_chat)
    assert TITLE not in chip["chip"] and chip["chat_id"] is None
    assert tool_steps.running("borrow_context", call, anas_other)["label"] == f"Reading “{TITLE}”…"


def test_anas_own_next_private_chat_holds_what_she_told_it(acme, anas_chat, ana, ada, fake_llm):
    again = factories.chat(acme, [ada], "Ana again", people=[ana])

    request = _ask(fake_llm, again, ana, ada, "What is my locker code?")

    assert f"Ana's locker code is {SECRET}." in _memory_section(request)
    context = request["messages"][-1]["content"]
    assert f"Ana told me her locker code, {SECRET}." in context and anas_chat.public_id in context
    recalled = _recalled(ada, again, "locker code")
    assert f"Ana's locker code is {SECRET}." in recalled and f"My locker code is {SECRET}." in recalled
    assert borrow_context(_context(ada, again), anas_chat.public_id)["success"] is True


def test_a_chat_of_both_uses_only_what_both_may_hear(acme, ana, ben, ada, fake_llm):
    chats = {
        "ana": factories.chat(acme, [ada], "Ana alone", people=[ana]),
        "ben": factories.chat(acme, [ada], "Ben alone", people=[ben]),
        "both": factories.chat(acme, [ada], "Ana and Ben", people=[ana, ben]),
        "shared": factories.chat(acme, [ada], "Everyone's"),
    }
    for key, chat in chats.items():
        factories.memory(ada, f"Told in {key}: a kumquat fact.", chat_id=chat.id)
        factories.message(chat, f"Said in {key}: a kumquat story.", author=ana if key != "ben" else ben)
        factories.summary(chat, ada, f"Summary of {key}.")
    factories.memory(ada, "For everyone: a kumquat rule.")

    request = _ask(fake_llm, chats["both"], ben, ada, "Tell me about kumquats.")

    section, sent = _memory_section(request), json.dumps(request)
    assert "Told in both" in section and "Told in shared" in section and "For everyone" in section
    assert "Told in ana" not in sent and "Told in ben" not in sent
    assert "Summary of shared." in sent and "Summary of ana." not in sent and "Summary of ben." not in sent
    recalled = _recalled(ada, chats["both"], "kumquat")
    assert "Said in shared" in recalled and "Said in ana" not in recalled and "Said in ben" not in recalled
    assert "Told in ana" not in recalled and "Told in ben" not in recalled
    # What was left out is counted among what may be heard only: nothing is said about the private rest.
    held, _ = prompt_memory(for_agent(ada), chats["both"], ada, utcnow())
    assert held.core_total == 3 and held.left_out == 0


def test_sharing_a_chat_makes_its_memories_heard_and_private_again_narrows_them(
    acme, anas_chat, ben, ada, fake_llm
):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])

    anas_chat.visibility = "shared"
    db.session.commit()
    shared = _ask(fake_llm, bens_chat, ben, ada, "Anything about lockers?")
    anas_chat.visibility = "private"
    db.session.commit()
    private_again = _ask(fake_llm, bens_chat, ben, ada, "And now?")

    assert SECRET in _memory_section(shared) and f"Ana told me her locker code, {SECRET}." in json.dumps(
        shared
    )
    assert SECRET not in json.dumps(private_again)


def test_a_person_added_to_a_chat_ends_the_context_borrowed_into_it_from_a_chat_they_may_not_read(
    acme, anas_chat, ana, ben, ada
):
    again = factories.chat(acme, [ada], "Ana again", people=[ana])
    factories.message(again, "Hi", author=ana)
    assert borrow_context(_context(ada, again), anas_chat.public_id)["success"] is True
    assert SECRET in build_prompt(again, ada).messages[-1]["content"]

    factories.add_person(again, ben)

    assert SECRET not in json.dumps(build_prompt(again, ada).messages)


def test_saving_what_another_private_chat_holds_saves_it_for_this_chat_too(acme, anas_chat, ben, ada):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])

    result = save_memory(_context(ada, bens_chat), f"Ana's locker code is {SECRET}.", "core")

    assert result["saved"] is True
    assert db.session.get(AgentMemory, result["memory_id"]).chat_id == bens_chat.id


# The jobs that write memories


def test_consolidating_anas_private_chat_writes_memories_heard_in_it_and_shows_only_those(
    acme, ana, ben, ada, fake_llm
):
    anas_chat = factories.chat(acme, [ada], TITLE, people=[ana])
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])
    factories.memory(ada, "Ben's bike lock is 4242.", chat_id=bens_chat.id)
    factories.message(anas_chat, f"My locker code is {SECRET}.", author=ana)
    fake_llm.reply(
        json.dumps({"journal": [], "core": [f"Ana's locker is {SECRET}.", "Ben's bike lock is 4242."]})
    )

    consolidate_chat(anas_chat.id, force=True)

    assert "Ben's bike lock" not in fake_llm.requests[0]["messages"][0]["content"]
    made = db.session.scalars(
        sa.select(AgentMemory).where(AgentMemory.chat_id == anas_chat.id).order_by(AgentMemory.id)
    ).all()
    # A memory heard only in Ben's chat is not "already known" in Ana's: hers gets its own copy.
    assert [(m.content, m.audience) for m in made] == [
        (f"Ana's locker is {SECRET}.", "chat"),
        ("Ben's bike lock is 4242.", "chat"),
    ]
    assert f"Ana's locker is {SECRET}." not in _heard_in(bens_chat)


def test_reflection_keeps_a_promoted_entrys_audience(acme, anas_chat, ada, fake_llm):
    entry = factories.memory(ada, "Ana is moving lockers next week.", "journal", chat_id=anas_chat.id)
    fake_llm.reply(json.dumps({"promote": [1]}))

    reflect_agent(ada.id)

    db.session.refresh(entry)
    assert (entry.memory_type, entry.chat_id, entry.audience) == ("core", anas_chat.id, "chat")


def _session(agent, audience: Audience = EVERYONE) -> RefinementSession:
    return RefinementSession(
        agent=agent,
        session_id="s-1",
        start_tokens=1000,
        max_mutations=10,
        floor=0.0,
        page_tokens=4000,
        audience=audience,
    )


def test_a_refinement_pass_finds_no_memory_of_another_audience(acme, anas_chat, ben, ada):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])
    anas = factories.memory(ada, "Ana likes tea.", chat_id=anas_chat.id)
    bens = factories.memory(ada, "Ben likes tea.", chat_id=bens_chat.id)
    everyones = factories.memory(ada, "Tea is served at four.")
    session = _session(ada, Audience(anas_chat.id))

    for other in (bens, everyones):
        merged = session.run({"action": "consolidate", "ids": f"{anas.id},{other.id}", "content": "Tea."})
        rewritten = session.run({"action": "update", "id": str(other.id), "content": "Tea."})
        assert merged["type"] == "error" and "not among the memories listed" in merged["error"]
        assert (rewritten["type"], rewritten["error"]) == ("error", f"Memory #{other.id} not found")
    assert [r["id"] for r in session.run({"action": "search", "query": "tea"})["results"]] == [anas.id]
    assert session.mutations == 0
    assert db.session.scalar(sa.select(sa.func.count()).where(AgentMemory.deleted_at.is_not(None))) == 0
    db.session.expire_all()
    assert {m.content for m in (anas, bens, everyones)} == {
        "Ana likes tea.",
        "Ben likes tea.",
        "Tea is served at four.",
    }


def test_a_refinement_merge_within_one_audience_keeps_it_and_so_does_its_note(acme, anas_chat, ada):
    first = factories.memory(ada, "Ana likes tea.", chat_id=anas_chat.id)
    second = factories.memory(ada, "Ana likes green tea best.", chat_id=anas_chat.id)
    session = _session(ada, Audience(anas_chat.id))

    page = session.run({"action": "page", "page": "1"})
    merged = session.run(
        {"action": "consolidate", "ids": f"{first.id},{second.id}", "content": "Ana: green tea."}
    )
    session.run({"action": "complete", "summary": "Merged Ana's tea."})

    assert {r["heard_by"] for r in page["results"]} == {f"conversation {anas_chat.public_id}"}
    memory = db.session.get(AgentMemory, merged["new_id"])
    assert (memory.chat_id, memory.audience) == (anas_chat.id, "chat")
    note = db.session.scalar(
        sa.select(AgentMemory).where(AgentMemory.content.startswith("Refinement session"))
    )
    assert (note.chat_id, note.audience) == (anas_chat.id, "chat")


def test_dedup_keeps_a_copy_for_each_audience(acme, anas_chat, ada):
    kept = [
        factories.memory(ada, "Tea at four.", chat_id=anas_chat.id),
        factories.memory(ada, "Tea at four."),
    ]
    factories.memory(ada, "tea at four", chat_id=anas_chat.id)

    assert dedup_for_agent(ada.id, session_id=None, via="test") == 1
    active = db.session.scalars(sa.select(AgentMemory.id).where(AgentMemory.deleted_at.is_(None))).all()
    assert sorted(m.id for m in kept) == sorted(i for i in active if i in {m.id for m in kept})
    assert (
        len([i for i in active if db.session.get(AgentMemory, i).content.casefold().startswith("tea")]) == 2
    )


# The ledger


def _secret_memory() -> AgentMemory:
    return db.session.scalar(sa.select(AgentMemory).where(AgentMemory.content.contains(SECRET)))


def test_the_ledger_names_a_private_audience_by_its_people_not_its_title(client, signed_in, anas_chat, ada):
    page = client.get(f"/admin/agents/{ada.id}/memories")

    assert page.status_code == 200
    assert "private: Ana&#39;s chat" in page.text and TITLE not in page.text
    assert "Widen to everyone" in page.text


def test_widening_and_narrowing_a_memory_is_audited_and_undone(acme, client, signed_in, anas_chat, ben, ada):
    bens_chat = factories.chat(acme, [ada], "Ben's", people=[ben])
    memory = _secret_memory()

    widened = client.post(f"/admin/memories/{memory.id}/audience", data={"audience": "everyone"})
    assert widened.status_code == 303
    db.session.expire_all()
    assert memory.audience == "everyone" and memory.chat_id == anas_chat.id
    assert memory.content in _heard_in(bens_chat)
    row = db.session.scalar(sa.select(AuditLog).where(AuditLog.action == "memory_audience"))
    assert (row.data["before"]["audience"], row.data["after"]["audience"], row.user_id) == (
        "chat",
        "everyone",
        signed_in.id,
    )
    audit = client.get("/admin/audit")
    assert "audience changed" in audit.text and "Widened: heard by everyone" in audit.text

    assert client.post(f"/admin/audit/{row.id}/undo").status_code == 303
    db.session.expire_all()
    assert memory.audience == "chat" and memory.content not in _heard_in(bens_chat)

    client.post(f"/admin/memories/{memory.id}/audience", data={"audience": "everyone"})
    narrowed = client.post(
        f"/admin/memories/{memory.id}/audience", data={"audience": "chat"}, headers={"HX-Request": "true"}
    )
    db.session.expire_all()
    assert narrowed.status_code == 200 and "Widen to everyone" in narrowed.text
    assert memory.audience == "chat" and memory.content not in _heard_in(bens_chat)
    assert db.session.scalar(sa.select(sa.func.count()).where(AuditLog.action == "memory_audience")) == 3


def test_a_memory_from_no_chat_cannot_be_narrowed(client, signed_in, ada):
    memory = factories.memory(ada, "An admin's rule.")

    refused = client.post(
        f"/admin/memories/{memory.id}/audience", data={"audience": "chat"}, headers={"HX-Request": "true"}
    )

    assert refused.status_code == 422 and "came from no chat" in refused.text
    db.session.expire_all()
    assert memory.audience == "everyone"
    assert db.session.scalar(sa.select(sa.func.count()).where(AuditLog.action == "memory_audience")) == 0


def test_an_admins_ledger_entry_is_heard_by_everyone(client, signed_in, acme, ben, ada):
    client.post(
        f"/admin/agents/{ada.id}/memories", data={"content": "House rule: no shoes.", "memory_type": "core"}
    )

    memory = db.session.scalar(sa.select(AgentMemory).where(AgentMemory.content == "House rule: no shoes."))
    assert (memory.chat_id, memory.audience) == (None, "everyone")
    assert memory.content in _heard_in(factories.chat(acme, [ada], "Ben's", people=[ben]))


# flask memories backfill-audience


def _old_memory(agent, content: str, **provenance) -> AgentMemory:
    """A memory as Cairn wrote them before memories had an audience: no chat, its chat in its audit row."""
    memory = factories.memory(agent, content)
    db.session.add(
        AuditLog(
            action="memory_create",
            auditable_type="AgentMemory",
            auditable_id=memory.id,
            account_id=agent.account_id,
            agent_id=agent.id,
            data={"before": None, "after": {"content": content}, **provenance},
        )
    )
    db.session.commit()
    return memory


def test_backfill_audience_ties_old_memories_to_their_chats_once(runner, acme, admin, ada):
    old_chat, other_chat = factories.chat(acme, [ada], "Old"), factories.chat(acme, [ada], "Other")
    saved = _old_memory(ada, "Saved while chatting.", via="save_memory", chat_id=old_chat.id, message_id=1)
    consolidated = _old_memory(ada, "Consolidated.", via="consolidation", chat_id=old_chat.id)
    by_hand = _old_memory(ada, "Typed by an admin.", via="admin")
    heard_before = _heard_in(other_chat)

    first = runner.invoke(args=["memories", "backfill-audience"])
    second = runner.invoke(args=["memories", "backfill-audience"])

    assert first.exit_code == 0 and "Done: 2 memories tied to the chats they came from" in first.output
    assert "1 memory came from no recorded chat" in first.output
    db.session.expire_all()
    assert [(m.chat_id, m.audience) for m in (saved, consolidated, by_hand)] == [
        (old_chat.id, "chat"),
        (old_chat.id, "chat"),
        (None, "everyone"),
    ]
    assert _heard_in(other_chat) == heard_before  # the old chats are shared: nothing heard goes quiet
    assert second.exit_code == 0 and "Nothing to do" in second.output
    assert db.session.scalar(sa.select(sa.func.count()).where(AuditLog.action == "memory_audience")) == 2
