"""Temporary chats (issue 42, part 2): "Nothing from this chat is remembered". No memory, summary or consolidation
comes of one, save_memory is not offered in it, no other chat (recall, borrow, summaries) nor a client's search
reads it; its people delete it for good, or have it deleted some days after its last message; /v1 starts one with
X-Cairn-Remember: no."""

# ruff: noqa: F811  (the fixtures of test_memory_audience, imported, are parameters here)
import html
import json
from datetime import timedelta

import pytest
import sqlalchemy as sa
import time_machine

from tests import factories
from tests.test_api_v1 import _ask as api_ask
from tests.test_api_v1 import _body, _key
from tests.test_derived_privacy import _client, _each_request_signs_in_afresh  # noqa: F401  (autouse)
from tests.test_memory_audience import _person, ana, ben  # noqa: F401  (fixtures)
from webapp.actions import memory as memory_actions
from webapp.agent_files.export_chats import included_chats
from webapp.extensions import db
from webapp.jobs.consolidation import consolidate_chat, consolidate_stale_chats
from webapp.jobs.replies import request_replies, respond
from webapp.jobs.summaries import summarize
from webapp.jobs.temporary_chats import delete_expired_temporary_chats
from webapp.models import AgentMemory, Chat, ChatAgent, JobRun, LlmCall, Message, ReplySources
from webapp.timeutil import utcnow

SECRET = "my new door code is 4471-PLUM"


@pytest.fixture
def ada(acme):
    tools = ["save_memory", "recall", "borrow_context"]
    return factories.agent(acme, "Ada", enabled_tools=tools, consolidates_direct_chats=True)


def _ask(fake_llm, chat, person, agent, text, *tool_calls, answer="Noted."):
    """`person` says `text` in `chat`; the agent makes the tool calls, then answers; what the reply drew on."""
    factories.message(chat, text, author=person)
    [reply] = request_replies(chat, [agent])
    db.session.commit()
    if tool_calls:
        fake_llm.reply(tool_calls=list(tool_calls))
    fake_llm.reply(answer)
    respond([reply.id])
    db.session.expire_all()
    return db.session.get(ReplySources, reply.id)


@pytest.fixture
def temporary(app, ana, ada):
    """Ana's temporary chat, started from the new-chat form."""
    started = _client(app, ana).post(
        "/chats/new", data={"title": "Just between us", "agent_ids": [ada.id], "temporary": "y"}
    )
    assert started.status_code == 303
    chat = db.session.scalar(sa.select(Chat).where(Chat.title == "Just between us"))
    assert chat.remembers is False and chat.visibility == "private"
    return chat


def _count(model, *where) -> int:
    db.session.expire_all()
    return db.session.scalar(sa.select(sa.func.count()).select_from(model).where(*where))


@pytest.mark.parametrize("tries_to_save", [False, True])
def test_a_temporary_chat_leaves_no_memory_summary_or_consolidation(
    app, temporary, ana, ada, fake_llm, tries_to_save
):
    save = ("save_memory", {"content": f"Ana: {SECRET}", "memory_type": "core"})
    calls = [save] if tries_to_save else []
    fake_llm.requests.clear()

    _ask(fake_llm, temporary, ana, ada, f"Remember this: {SECRET}", *calls)
    summarize(temporary.id, ada.id)
    with time_machine.travel(utcnow() + timedelta(days=2), tick=False):
        found = consolidate_stale_chats()
        consolidate_chat(temporary.id, force=True)

    offered = [t["function"]["name"] for t in fake_llm.requests[0].get("tools", [])]
    assert "save_memory" not in offered and "recall" in offered
    assert "temporary" in json.dumps(fake_llm.requests[0])  # the model is told nothing here is remembered
    if tries_to_save:  # the call is refused as a tool it was not offered, and said so to the model
        assert "save_memory" in json.dumps(fake_llm.requests[1]) and len(fake_llm.requests) == 2
    assert _count(AgentMemory) == 0
    assert _count(ChatAgent, ChatAgent.agent_summary.is_not(None)) == 0
    assert found == {"chats": 0}
    consolidations = _count(LlmCall, LlmCall.purpose.in_(("extract", "summarize")))
    assert consolidations == 0 and _count(JobRun, JobRun.job_type == "summarize") <= 1


def test_other_chats_of_the_same_person_never_read_it(app, acme, temporary, ana, ada, fake_llm):
    _ask(fake_llm, temporary, ana, ada, f"Between us: {SECRET}")
    factories.summary(temporary, ada, f"Ana said {SECRET}")  # even if a summary existed, it is not heard
    other = factories.chat(acme, [ada], "Ana's everyday chat", people=[ana])
    fake_llm.requests.clear()

    sources = _ask(
        fake_llm,
        other,
        ana,
        ada,
        "What is my door code?",
        ("recall", {"query": "door code PLUM"}),
        ("borrow_context", {"conversation_id": temporary.public_id}),
    )

    sent = json.dumps(fake_llm.requests)
    assert "4471" not in sent and "PLUM" not in sent.replace("door code PLUM", "")
    assert temporary.id not in (sources.recalled_chat_ids or []) and sources.borrowed_chat_id is None
    assert temporary.id not in (sources.summary_chat_ids or [])
    # Nor does a client's search (MCP's search_memory, outside any chat) find its words.
    found = memory_actions.search_memory(ana, ada, "door code PLUM")
    assert "4471" not in json.dumps(found)
    assert temporary not in included_chats(ada, None)  # nor does the agent's file carry it
    # In the temporary chat itself, recall still finds them.
    fake_llm.requests.clear()
    _ask(fake_llm, temporary, ana, ada, "What did I say?", ("recall", {"query": "door code PLUM"}))
    assert "4471-PLUM" in json.dumps(fake_llm.requests[1])


def test_the_chat_says_it_is_temporary_at_its_top_in_the_sidebar_and_the_list(app, temporary, ana, ada):
    anas = _client(app, ana)
    factories.chat(ana.account, [ada], "Remembered one", people=[ana])

    page = html.unescape(anas.get(f"/chats/{temporary.id}").text)
    listing = html.unescape(anas.get("/chats/").text)

    assert "Temporary chat." in page and "Nothing from it is remembered" in page
    assert "Delete for good" in page
    side = page.split('class="side-list"', 1)[-1] if 'class="side-list"' in page else page
    assert "Temporary" in side
    row = listing.split("Just between us", 1)[1].split("</li>", 1)[0]
    assert "Temporary" in row
    other_row = listing.split("Remembered one", 1)[1].split("</li>", 1)[0]
    assert "Temporary" not in other_row


def test_deleting_it_leaves_no_message_row(app, temporary, ana, ben, ada, fake_llm):
    _ask(fake_llm, temporary, ana, ada, f"Between us: {SECRET}")
    messages = [m.id for m in db.session.scalars(sa.select(Message).where(Message.chat_id == temporary.id))]
    calls = _count(LlmCall, LlmCall.chat_id == temporary.id)
    assert messages and calls
    assert _client(app, ben).post(f"/chats/{temporary.id}/delete").status_code == 404  # not Ben's to see

    deleted = _client(app, ana).post(f"/chats/{temporary.id}/delete", follow_redirects=True)

    assert "“Just between us” and all its messages are deleted for good." in html.unescape(deleted.text)
    assert _count(Message, Message.id.in_(messages)) == 0
    assert _count(Chat, Chat.id == temporary.id) == 0
    assert _count(ReplySources, ReplySources.message_id.in_(messages)) == 0
    assert _count(LlmCall) == calls  # the cost ledger keeps its rows, no longer naming the chat
    assert _client(app, ana).get(f"/chats/{temporary.id}").status_code == 404


def test_a_chat_that_remembers_or_one_being_answered_is_not_deleted(app, acme, temporary, ana, ada):
    remembered = factories.chat(acme, [ada], "Kept", people=[ana])
    factories.message(remembered, "Keep me", author=ana)
    factories.message(temporary, "Answer me", author=ana)
    factories.message(temporary, "", author=ada, status="streaming")
    anas = _client(app, ana)

    kept = anas.post(f"/chats/{remembered.id}/delete", follow_redirects=True)
    answering = anas.post(f"/chats/{temporary.id}/delete", follow_redirects=True)

    assert "Only a temporary chat is deleted for good; discard this one instead." in html.unescape(kept.text)
    assert "An agent is still answering in this chat" in html.unescape(answering.text)
    assert _count(Message, Message.chat_id.in_([remembered.id, temporary.id])) == 3


def test_the_persons_setting_deletes_their_temporary_chats_after_n_days(app, acme, ana, ben, ada):
    anas = _client(app, ana)
    assert "never: I delete them myself" in anas.get("/account/memories").text
    saved = anas.post("/account/memories/temporary-chats", data={"days": "7"}, follow_redirects=True)
    assert "deleted for good 7 days after their last message" in html.unescape(saved.text)
    assert anas.post("/account/memories/temporary-chats", data={"days": "5"}).status_code == 400
    old, recent = (factories.chat(acme, [ada], t, people=[ana], remembers=False) for t in ("Old", "Recent"))
    remembered = factories.chat(acme, [ada], "Remembered", people=[ana])
    bens = factories.chat(acme, [ada], "Ben's", people=[ben], remembers=False)  # Ben set nothing
    with time_machine.travel(utcnow() - timedelta(days=8), tick=False):
        for chat in (old, remembered, bens):
            factories.message(chat, "long ago", author=ana)
    factories.message(recent, "today", author=ana)
    assert "deleted for good 7 days after its last message" in anas.get(f"/chats/{recent.id}").text

    assert delete_expired_temporary_chats() == {"deleted": 1}
    assert (
        "{'deleted': 0}"
        in app.test_cli_runner().invoke(args=["jobs", "delete-temporary-chats", "--now"]).output
    )

    left = set(db.session.scalars(sa.select(Chat.title)))
    assert left == {"Recent", "Remembered", "Ben's"}
    assert _count(Message, Message.chat_id == old.id) == 0


def test_v1_starts_a_temporary_chat_with_x_cairn_remember_no(client, admin, acme, ada, fake_llm):
    secret = _key(admin)
    no = {"X-Cairn-Remember": "no"}

    fake_llm.reply("Hi.")
    first = api_ask(client, secret, _body("Hello"), no)
    fake_llm.reply("Again.")
    continued = api_ask(client, secret, _body("And?", history=[("user", "Hello"), ("assistant", "Hi.")]), no)
    fake_llm.reply("Fresh.")
    remembered = api_ask(client, secret, _body("And?", history=[("user", "Hello"), ("assistant", "Hi.")]))

    assert first.status_code == continued.status_code == remembered.status_code == 200
    db.session.rollback()
    chats = db.session.scalars(sa.select(Chat).where(Chat.source == "api").order_by(Chat.id)).all()
    assert [c.remembers for c in chats] == [False, True]  # the history continues the temporary chat only
    assert _count(Message, Message.chat_id == chats[0].id) == 4
    bad = api_ask(client, secret, _body("Hello"), {"X-Cairn-Remember": "maybe"}, worker=False)
    assert bad.status_code == 400 and "X-Cairn-Remember must be yes or no" in bad.text
    fake_llm.reply("Named.")
    named = {"X-Cairn-Conversation": "garden"}
    assert api_ask(client, secret, _body("Hi"), named).status_code == 200
    turned = api_ask(client, secret, _body("Hi"), {**named, **no}, worker=False)
    assert turned.status_code == 409 and "The conversation `garden` is remembered" in turned.text
