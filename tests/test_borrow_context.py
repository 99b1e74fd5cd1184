"""The borrow_context tool: its refusals, what it stages, and which activation sees it (DESIGN 5.2)."""

import json

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.replies import ReplyFailed, request_replies, respond, retry_reply
from webapp.models import ChatAgent, Message, public_ids
from webapp.timeutil import utcnow
from webapp.tools import REGISTRY, ToolContext
from webapp.tools.borrow_context import borrow_context

BORROWED_HEADING = "# Borrowed Context from Conversation"


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "borrow_context"])


@pytest.fixture
def here(admin, ada):
    chat = factories.chat(admin.account, [ada], "Garden club")
    factories.message(chat, "What should we plant?", author=admin)
    return chat


@pytest.fixture
def roses(admin, ada):
    chat = factories.chat(admin.account, [ada], "Roses")
    factories.message(chat, "The wall faces north.", author=admin)
    factories.message(chat, "Then Albéric Barbier.", author=ada)
    return chat


def _context(agent, chat) -> ToolContext:
    return ToolContext(agent=agent, chat=chat, message=None)


def _staged(chat, agent) -> dict | None:
    db.session.expire_all()
    return db.session.scalar(
        sa.select(ChatAgent.borrowed_context_json).where(
            ChatAgent.chat_id == chat.id, ChatAgent.agent_id == agent.id
        )
    )


# The tool on its own


def test_borrowing_stages_the_other_chats_recent_messages(ada, here, roses):
    result = borrow_context(_context(ada, here), roses.public_id)

    assert result == {
        "success": True,
        "message": 'Here are the recent messages of "Roses": use them in this reply. They will also be in '
        "your system prompt for your next response in this conversation.",
        "message_count": 2,
        "messages": [  # the tool result carries them: usable in the same reply (issue 15)
            {"author": "dana", "content": "The wall faces north."},
            {"author": "Ada", "content": "Then Albéric Barbier."},
        ],
    }
    staged = _staged(here, ada)
    assert set(staged) == {"source_conversation_id", "messages", "staged_at"}
    assert staged["source_conversation_id"] == roses.public_id
    assert staged["messages"] == [
        {"author": "dana", "content": "The wall faces north."},
        {"author": "Ada", "content": "Then Albéric Barbier."},
    ]
    assert _staged(roses, ada) is None


def test_the_id_may_come_with_the_brackets_the_prompt_shows(ada, here, roses):
    result = borrow_context(_context(ada, here), f" [{roses.public_id}] ")

    assert result["success"] is True
    assert _staged(here, ada)["source_conversation_id"] == roses.public_id


def test_borrowing_takes_the_last_ten_finished_messages_each_cut_to_2000_characters(admin, ada, here):
    source = factories.chat(admin.account, [ada], "Long")
    for i in range(12):
        factories.message(source, f"{i} " + "y" * 2500, author=admin)
    factories.message(source, "", author=ada, status="pending")
    factories.message(source, "A notice.", role="system")

    borrow_context(_context(ada, here), source.public_id)

    messages = _staged(here, ada)["messages"]
    assert [m["content"].split(" ")[0] for m in messages] == [str(i) for i in range(2, 12)]
    assert all(len(m["content"]) == 2000 and m["content"].endswith("…") for m in messages)


def test_borrowing_again_replaces_the_staged_context(admin, ada, here, roses):
    other = factories.chat(admin.account, [ada], "Tomatoes")
    factories.message(other, "Blight again.", author=admin)

    borrow_context(_context(ada, here), roses.public_id)
    borrow_context(_context(ada, here), other.public_id)

    assert _staged(here, ada)["messages"] == [{"author": "dana", "content": "Blight again."}]


def test_borrowing_needs_an_agent_and_a_chat(ada, here, roses):
    assert borrow_context(ToolContext(agent=None, chat=here, message=None), roses.public_id) == {
        "error": "Requires chat and agent context"
    }


@pytest.mark.parametrize("kind", ["garbage", "database id", "unknown id", "not a participant", "discarded"])
def test_borrowing_from_a_chat_the_agent_cannot_see_is_not_found(admin, ada, here, roses, kind):
    basil = factories.agent(admin.account, "Basil")
    elsewhere = factories.chat(admin.account, [basil], "Basil alone")
    factories.message(elsewhere, "Basil's business.", author=admin)
    if kind == "discarded":
        roses.discarded_at = utcnow()
        db.session.commit()
    conversation_id = {
        "garbage": "zz-not-an-id",
        "database id": str(roses.id),
        "unknown id": public_ids.encode(999_999),
        "not a participant": elsewhere.public_id,
        "discarded": roses.public_id,
    }[kind]

    result = borrow_context(_context(ada, here), conversation_id)

    assert result == {"error": "Conversation not found or you are not a participant"}
    assert _staged(here, ada) is None


def test_borrowing_from_another_accounts_chat_is_not_found(ada, here, stranger):
    # Even a chat of another account that (by a data error) holds this agent.
    foreign = factories.chat(stranger.account, [ada, factories.agent(stranger.account, "Mallory")], "Globex")
    factories.message(foreign, "Globex secrets.", author=stranger)

    result = borrow_context(_context(ada, here), foreign.public_id)

    assert result == {"error": "Conversation not found or you are not a participant"}
    assert _staged(here, ada) is None


def test_borrowing_from_the_current_chat_is_refused(ada, here):
    assert borrow_context(_context(ada, here), here.public_id) == {
        "error": "Cannot borrow from the current conversation"
    }


def test_borrowing_from_a_chat_without_messages_is_refused(admin, ada, here):
    empty = factories.chat(admin.account, [ada], "Empty")
    factories.message(empty, "Ada joined the conversation.", role="system")

    assert borrow_context(_context(ada, here), empty.public_id) == {
        "error": "No messages found in that conversation"
    }


def test_the_tool_is_registered_with_a_schema_for_the_model():
    schema = REGISTRY["borrow_context"].schema()["function"]

    assert schema["parameters"]["required"] == ["conversation_id"]
    assert "another conversation you participate in" in schema["description"]


# Through replies: which activation sees the borrowed context


@pytest.fixture
def activate(admin, fake_llm):
    """Run one reply of an agent after a new message from Dana, against scripted answers."""

    def run(chat, agent, *answers) -> Message:
        factories.message(chat, "Go on.", author=admin)
        [reply] = request_replies(chat, [agent])
        db.session.commit()
        fake_llm.requests.clear()
        for answer in answers:
            answer(fake_llm)
        respond([reply.id])
        return reply

    return run


def _says(text):
    return lambda fake: fake.reply(text)


def _borrows(chat):
    return lambda fake: fake.reply(tool_calls=[("borrow_context", {"conversation_id": chat.public_id})])


def _prompt_contexts(fake_llm) -> list[str]:
    return [request["messages"][-1]["content"] for request in fake_llm.requests if request["messages"]]


def _context_of_first_request(fake_llm) -> str:
    return fake_llm.requests[0]["messages"][-1]["content"]


def test_a_borrow_in_activation_n_reaches_n_plus_1_only(activate, fake_llm, ada, here, roses):
    activate(here, ada, _borrows(roses), _says("I'll look at Roses next time."))

    tool_result = json.loads(fake_llm.requests[-1]["messages"][-1]["content"])
    assert tool_result["success"] is True
    assert tool_result["messages"][0] == {"author": "dana", "content": "The wall faces north."}  # usable now
    assert all(BORROWED_HEADING not in c for c in _prompt_contexts(fake_llm))
    assert _staged(here, ada) is not None  # staged during N, so N's success must not clear it

    activate(here, ada, _says("Given the north wall: Albéric Barbier."))

    context = _context_of_first_request(fake_llm)
    assert f"{BORROWED_HEADING} {roses.public_id}" in context
    assert "[dana]: The wall faces north.\n[Ada]: Then Albéric Barbier." in context
    assert context.index("# Your memory") < context.index(BORROWED_HEADING) < context.index("# Now")
    assert _staged(here, ada) is None

    activate(here, ada, _says("Anything else?"))

    assert BORROWED_HEADING not in _context_of_first_request(fake_llm)


def test_a_failed_activation_keeps_the_borrowed_context_for_the_next(activate, fake_llm, ada, here, roses):
    activate(here, ada, _borrows(roses), _says("Noted."))

    with pytest.raises(ReplyFailed):
        activate(here, ada, lambda fake: fake.fail(400, "bad request"))

    assert BORROWED_HEADING in _context_of_first_request(fake_llm)
    assert _staged(here, ada) is not None

    activate(here, ada, _says("Now with the context."))

    assert BORROWED_HEADING in _context_of_first_request(fake_llm)
    assert _staged(here, ada) is None


def test_retrying_the_failed_reply_itself_sees_the_borrowed_context(activate, fake_llm, ada, here, roses):
    activate(here, ada, _borrows(roses), _says("Noted."))
    with pytest.raises(ReplyFailed):
        activate(here, ada, lambda fake: fake.fail(400, "bad request"))
    failed = db.session.scalar(sa.select(Message).where(Message.status == "failed"))
    retry_reply(failed)
    db.session.commit()
    fake_llm.requests.clear()
    fake_llm.reply("Second try.")

    respond([failed.id])

    assert BORROWED_HEADING in _context_of_first_request(fake_llm)
    assert _staged(here, ada) is None


def test_context_borrowed_while_using_borrowed_context_survives_to_the_next_activation(
    admin, activate, fake_llm, ada, here, roses
):
    tomatoes = factories.chat(admin.account, [ada], "Tomatoes")
    factories.message(tomatoes, "Blight again.", author=admin)
    activate(here, ada, _borrows(roses), _says("Noted."))

    activate(here, ada, _borrows(tomatoes), _says("Roses read; Tomatoes next."))

    assert "[dana]: The wall faces north." in _context_of_first_request(fake_llm)
    staged = _staged(here, ada)
    assert staged["source_conversation_id"] == tomatoes.public_id

    activate(here, ada, _says("Blight it is."))

    context = _context_of_first_request(fake_llm)
    assert "[dana]: Blight again." in context and "The wall faces north." not in context
    assert _staged(here, ada) is None


def test_an_agent_without_the_tool_cannot_borrow(activate, fake_llm, here, roses, ada):
    ada.enabled_tools = ["save_memory"]
    db.session.commit()

    activate(here, ada, _borrows(roses), _says("Oh well."))

    assert "You have no tool named 'borrow_context'" in fake_llm.requests[-1]["messages"][-1]["content"]
    assert _staged(here, ada) is None
