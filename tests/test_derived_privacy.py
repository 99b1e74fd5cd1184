"""Words travel only as far as the chat they came from (issue 31, item 2): a chat whose replies drew on another
chat (recalled or borrowed from it, its summary listed, a memory made from it) is never shared with, or opened
to, anyone who may not read that chat; what is derived from it (its memories, its summary) stays where it is.
Ana's private chat Q borrows from P, the chat she has with Ben; then she tries to widen Q to Cleo."""

# ruff: noqa: F811  (the fixtures of test_memory_audience, imported, are parameters here)
import html
import json

import pytest
from flask import g

from tests import factories
from tests.conftest import Auth
from tests.test_memory_audience import _person, ana, ben  # noqa: F401  (fixtures)
from webapp.extensions import db
from webapp.jobs.replies import request_replies, respond
from webapp.models import Chat, ChatPerson, ReplySources

BENS_WORDS = "my divorce hearing is on 14 March, case KUMQUAT-42"
P_TITLE = "Ana and Ben plan"


@pytest.fixture(autouse=True)
def _each_request_signs_in_afresh(app):
    """Several people's clients take turns in one app context: forget whom the last request signed in."""

    @app.before_request
    def _forget_the_last_user() -> None:
        g.pop("_login_user", None)


@pytest.fixture
def cleo(acme):
    return _person(acme, "Cleo")


@pytest.fixture
def ada(acme):
    return factories.agent(acme, "Ada", enabled_tools=["save_memory", "recall", "borrow_context"])


@pytest.fixture
def p(acme, ana, ben, ada):
    """The chat Ana shares with Ben, in which Ben said something only the two of them may read."""
    chat = factories.chat(acme, [ada], P_TITLE, people=[ana, ben])
    factories.message(chat, BENS_WORDS, author=ben)
    factories.message(chat, "I am sorry to hear it.", author=ada)
    return chat


def _ask(fake_llm, chat, person, agent, text: str, *tool_calls) -> ReplySources:
    """`person` says `text` in `chat`; `agent` makes the tool calls, then answers quoting what they brought;
    what the reply drew on."""
    factories.message(chat, text, author=person)
    [reply] = request_replies(chat, [agent])
    db.session.commit()
    if tool_calls:
        fake_llm.reply(tool_calls=list(tool_calls))
    fake_llm.reply(f"Ben told you: {BENS_WORDS}.")
    respond([reply.id])
    db.session.expire_all()
    return db.session.get(ReplySources, reply.id)


@pytest.fixture
def q(acme, ana, ada, p, fake_llm):
    """Ana's private chat, whose reply borrowed from P and quotes Ben; its memory and summary, as the jobs make
    them (heard where Q may be read)."""
    chat = factories.chat(acme, [ada], "Ana alone", people=[ana])
    sources = _ask(
        fake_llm, chat, ana, ada, "What did Ben say?", ("borrow_context", {"conversation_id": p.public_id})
    )
    assert sources.borrowed_chat_id == p.id  # the reply drew on P
    factories.memory(ada, f"Ben's case is KUMQUAT-42 (from {chat.title}).", chat_id=chat.id)
    factories.summary(chat, ada, "Ana asked about Ben's KUMQUAT-42 hearing.")
    return chat


def _client(app, person) -> Auth:
    auth = Auth(app.test_client())
    auth.login(person)
    return auth.client


def test_sharing_a_chat_whose_reply_borrowed_from_a_private_one_is_refused_naming_it(
    app, acme, q, ana, cleo, ada, fake_llm
):
    anas = _client(app, ana)

    refused = anas.post(f"/chats/{q.id}/visibility", data={"visibility": "shared"}, follow_redirects=True)

    assert f"Not opened to everyone in Acme: its replies drew on “{P_TITLE}”" in html.unescape(refused.text)
    assert db.session.get(Chat, q.id).visibility == "private"
    cleos = _client(app, cleo)
    assert cleos.get(f"/chats/{q.id}").status_code == 404
    # Nor does anything derived from Q reach Cleo: her own chat's prompt holds none of it.
    shared = factories.chat(acme, [ada], "Everyone's")
    fake_llm.requests.clear()
    _ask(fake_llm, shared, cleo, ada, "Anything about Ben's divorce hearing?")
    asked = json.dumps(fake_llm.requests[0])
    assert "KUMQUAT" not in asked and "14 March" not in asked


def test_adding_someone_who_may_not_read_what_the_chat_drew_on_is_refused(app, q, ana, ben, cleo):
    anas = _client(app, ana)

    refused = anas.post(f"/chats/{q.id}/people", data={"user_id": cleo.id}, follow_redirects=True)

    assert f"Cleo was not added: its replies drew on “{P_TITLE}”, which Cleo may not read." in html.unescape(
        refused.text
    )
    assert {row.user_id for row in db.session.get(Chat, q.id).chat_people} == {ana.id}
    assert _client(app, cleo).get(f"/chats/{q.id}").status_code == 404
    # Ben may read P: he may be added, and reads Q.
    assert anas.post(f"/chats/{q.id}/people", data={"user_id": ben.id}).status_code == 303
    assert BENS_WORDS in _client(app, ben).get(f"/chats/{q.id}").text


def test_a_chat_whose_reply_recalled_a_private_chat_is_not_shared_either(app, acme, ana, ada, p, fake_llm):
    chat = factories.chat(acme, [ada], "Ana recalls", people=[ana])
    sources = _ask(
        fake_llm, chat, ana, ada, "KUMQUAT-42?", ("recall", {"query": "KUMQUAT-42 divorce hearing"})
    )
    assert p.id in sources.recalled_chat_ids

    refused = _client(app, ana).post(f"/chats/{chat.id}/visibility", data={"visibility": "shared"})

    assert refused.status_code == 303
    assert db.session.get(Chat, chat.id).visibility == "private"


def test_the_refusal_names_a_chat_the_actor_may_not_read_without_its_title(app, acme, q, ben, p):
    """Dan was in Q from the start (P was read by all three then); since, he left P: he may not see its title."""
    dan = _person(acme, "Dan")
    factories.add_person(q, ben)
    factories.add_person(p, dan)
    factories.add_person(q, dan)
    db.session.delete(db.session.get(ChatPerson, (p.id, dan.id)))
    db.session.commit()

    refused = _client(app, dan).post(
        f"/chats/{q.id}/visibility", data={"visibility": "shared"}, follow_redirects=True
    )

    assert "Not opened to everyone in Acme: its replies drew on a chat you cannot read" in html.unescape(
        refused.text
    )
    assert P_TITLE not in html.unescape(refused.text)


def test_a_person_taken_back_leaves_the_chats_that_drew_meanwhile_on_chats_they_may_not_read(
    app, acme, admin, ana, ben, ada, fake_llm
):
    both = factories.chat(acme, [ada], "Ana and Ben", people=[ana, ben])
    anas_own = factories.chat(acme, [ada], "Ana's diary", people=[ana])
    factories.message(anas_own, BENS_WORDS, author=ana)
    admins = _client(app, admin)
    assert admins.post(f"/people/{ben.id}/remove").status_code == 303
    # While Ben is away, Ana alone is present in their chat: a reply borrows from her diary.
    _ask(fake_llm, both, ana, ada, "My diary?", ("borrow_context", {"conversation_id": anas_own.public_id}))

    back = admins.post(f"/people/{ben.id}/restore", follow_redirects=True)

    assert "They left 1 of their chats, which drew on chats they may not read." in back.text
    assert {row.user_id for row in db.session.get(Chat, both.id).chat_people} == {ana.id}
    assert _client(app, ben).get(f"/chats/{both.id}").status_code == 404


def test_a_chat_waits_for_the_reply_being_written_before_it_is_widened(app, acme, ana, cleo, ada):
    """A reply in progress may still borrow or recall what only the chat's people may read: sharing the chat, or
    adding someone, waits until it is done."""
    chat = factories.chat(acme, [ada], "Ana alone", people=[ana])
    factories.message(chat, "What did Ben say?", author=ana)
    [reply] = request_replies(chat, [ada])
    reply.status = "streaming"
    db.session.commit()
    anas = _client(app, ana)

    shared = anas.post(f"/chats/{chat.id}/visibility", data={"visibility": "shared"}, follow_redirects=True)
    added = anas.post(f"/chats/{chat.id}/people", data={"user_id": cleo.id}, follow_redirects=True)

    assert (
        "Not opened to everyone in Acme: a reply is still being written here; try again once it is done."
        in html.unescape(shared.text)
    )
    assert "Cleo was not added: a reply is still being written here" in html.unescape(added.text)
    db.session.expire_all()
    assert db.session.get(Chat, chat.id).visibility == "private"
    assert {row.user_id for row in db.session.get(Chat, chat.id).chat_people} == {ana.id}
    reply.status = "done"
    db.session.commit()
    assert anas.post(f"/chats/{chat.id}/visibility", data={"visibility": "shared"}).status_code == 303
    assert db.session.get(Chat, chat.id).visibility == "shared"
