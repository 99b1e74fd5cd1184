"""Agents as files and privacy (issue 31, items 5 and 6): a file names chats only as its exporter may read them
and carries no database ids; a reply's tool steps go out and come back field by field; an import never speaks
for a person of the account nor puts a chat in anyone's list but the importer's."""

import io
import json

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.replies import request_replies, respond
from webapp.models import Agent, AgentMemory, Chat, Message
from webapp.tools.steps import UNNAMED_CHIP

SECRET_TITLE = "Milo's divorce"


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada", enabled_tools=["save_memory", "borrow_context", "recall"])


@pytest.fixture
def divorce(member, ada):
    """Milo's private chat with Ada."""
    chat = factories.chat(member.account, [ada], SECRET_TITLE, people=[member])
    factories.message(chat, "The hearing is on Friday.", author=member)
    factories.message(chat, "I will remember Friday.", author=ada)
    return chat


@pytest.fixture
def plans(member, ada, divorce, fake_llm):
    """Milo's chat "Plans", where a reply of Ada saved a memory and borrowed from the divorce chat (the real reply
    job, the fake model calling the tools); then Milo shared it, as chats were shared before widening was
    checked."""
    chat = factories.chat(member.account, [ada], "Plans", people=[member])
    factories.message(chat, "Help me plan the week.", author=member)
    [reply] = request_replies(chat, [ada])
    db.session.commit()
    fake_llm.reply(tool_calls=[("save_memory", {"content": "Milo plans his week", "memory_type": "core"})])
    fake_llm.reply(tool_calls=[("borrow_context", {"conversation_id": divorce.public_id})])
    fake_llm.reply(tool_calls=[("recall", {"query": "week"})])
    fake_llm.reply("Friday is busy.")
    respond([reply.id])
    chat.visibility = "shared"
    db.session.commit()
    steps = db.session.get(Message, reply.id).tools_used
    assert [s["chip"] for s in steps[:2]] == [
        "Saved to core memory: “Milo plans his week”",
        f"Borrowed 2 messages from “{SECRET_TITLE}”",
    ]
    return chat


def _export(runner, *args: str) -> dict:
    result = runner.invoke(args=["agents", "export", "Ada", "--with-chats", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _upload(client, document: dict, name: str = "Ada"):
    data = {"file": (io.BytesIO(json.dumps(document).encode()), "ada.cairn.json"), "name": name}
    return client.post("/agents/import", data=data)


def _numbers_named_as_ids(value) -> list[tuple[str, int]]:
    """Every number of a JSON value under a key that names an id (chat_id, memory_id, message_ids …)."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            items = item if isinstance(item, list) else [item]
            if key.endswith(("_id", "_ids")):
                found += [(key, n) for n in items if isinstance(n, int)]
            found += _numbers_named_as_ids(item)
    elif isinstance(value, list):
        for item in value:
            found += _numbers_named_as_ids(item)
    return found


def _steps_of(document: dict, title: str) -> list:
    chat = next(c for c in document["chats"] if c["title"] == title)
    return next(m["tools_used"] for m in chat["messages"] if m["tools_used"])


# Exports name chats only as their exporter may read them, and carry no ids.


def test_an_admins_download_names_no_chat_the_admin_may_not_read_and_holds_no_ids(
    client, signed_in, ada, plans
):
    response = client.post(f"/agents/{ada.id}/export", data={"with_chats": "1"})

    assert response.status_code == 200
    assert SECRET_TITLE not in response.text and "Milo\\u0027s divorce" not in response.text
    document = json.loads(response.data)
    assert _numbers_named_as_ids(document) == []
    saved, borrowed, recalled = _steps_of(document, "Plans")
    assert borrowed == {
        "tool": "borrow_context",
        "state": "done",
        "chip": UNNAMED_CHIP,
        "chat": borrowed["chat"],
    }
    secret = next(c for c in document["chats"] if c["ref"] == borrowed["chat"])
    assert secret["title"] is None and not secret["included"]
    memory = next(m for m in document["memories"] if m["ref"] == saved["memory"])
    assert memory["content"] == "Milo plans his week" and saved["memory_type"] == "core"
    assert recalled["tool"] == "recall" and set(recalled) == {"tool", "state", "chip"}


def test_the_command_line_names_every_chat_by_reference(runner, ada, plans):
    document = _export(runner)

    saved, borrowed, _ = _steps_of(document, "Plans")
    assert borrowed["chip"] == f"Borrowed 2 messages from “{SECRET_TITLE}”"
    assert next(c for c in document["chats"] if c["ref"] == borrowed["chat"])["title"] == SECRET_TITLE
    assert saved["memory"].startswith("m") and "memory_id" not in saved and "chat_id" not in borrowed


# Tool steps round-trip.


def test_a_chat_with_tool_steps_exports_and_imports_back_field_by_field(
    client, auth, runner, ada, plans, stranger
):
    first = _export(runner)
    auth.login(stranger)

    response = _upload(client, first)

    assert response.status_code == 303, response.text
    second = _export(runner, "--account", "Globex")
    for old, new in zip(first["chats"], second["chats"], strict=True):
        assert new["ref"] == old["ref"] and new["title"] == old["title"]
        for old_message, new_message in zip(old.get("messages", []), new.get("messages", []), strict=True):
            for field in old_message:
                assert new_message[field] == old_message[field], (old["title"], old_message["ref"], field)
    # Stored as the app stores steps, linked to the copy's own memory and chat: its chat page links them.
    copy = db.session.scalar(sa.select(Agent).where(Agent.account_id == stranger.account_id))
    copied_plans = db.session.scalar(
        sa.select(Chat).where(Chat.account_id == copy.account_id, Chat.title == "Plans")
    )
    reply = db.session.scalar(
        sa.select(Message).where(Message.chat_id == copied_plans.id, Message.agent_id == copy.id)
    )
    saved, borrowed, _ = reply.tools_used
    assert db.session.get(AgentMemory, saved["memory_id"]).agent_id == copy.id
    archive = db.session.get(Chat, borrowed["chat_id"])
    assert archive.account_id == copy.account_id and archive.title == SECRET_TITLE
    page = client.get(f"/chats/{copied_plans.id}").text
    assert f'href="/chats/{archive.id}"' in page and "“Milo&#39;s divorce”" in page


def test_a_version_1_file_still_imports_its_steps_without_their_ids_or_titles(
    client, auth, runner, ada, plans, stranger
):
    document = _export(runner)
    document["version"] = 1
    for chat in document["chats"]:
        for message in chat.get("messages", []):
            steps = message["tools_used"] or []
            for step in steps:  # as version 1 wrote them: the stored steps, ids and all
                if "memory" in step:
                    step["memory_id"] = 17
                    del step["memory"]
                if "chat" in step:
                    step["chat_id"] = 5
                    del step["chat"]
            if message["role"] == "user":
                message["tools_used"] = ["recall"]  # older Cairns stored a step as the tool's name
    auth.login(stranger)

    assert _upload(client, document).status_code == 303
    copied = db.session.scalars(
        sa.select(Message).join(Chat).where(Chat.account_id == stranger.account_id, Chat.title == "Plans")
    ).all()
    saved, borrowed, _ = next(m.tools_used for m in copied if m.role == "assistant")
    assert saved["memory_id"] is None and saved["chip"] == "Saved to core memory: “Milo plans his week”"
    assert borrowed["chat_id"] is None and borrowed["chip"] == UNNAMED_CHIP
    assert {m.role: m.tools_used for m in copied}["user"] == ["recall"]


def test_a_file_naming_a_database_id_in_a_step_is_refused(client, auth, runner, ada, plans, stranger):
    document = _export(runner)
    _steps_of(document, "Plans")[0]["memory"] = 17
    auth.login(stranger)

    response = _upload(client, document)

    assert response.status_code == 422 and "names a database id" in response.text
    assert db.session.scalar(sa.select(Agent).where(Agent.account_id == stranger.account_id)) is None


# An import speaks for no one and lists its chats for the importer only.


@pytest.fixture
def ayla_and_bruno(acme):
    return (
        factories.user(acme, "ayla@example.com", "member"),
        factories.user(acme, "bruno@example.com", "member"),
    )


def _file_by_ayla(runner, ada, visibility: str) -> dict:
    """A file whose chat was Ayla's and Bruno's, with Ayla's words, exported from another Cairn."""
    document = _export(runner)
    chat = next(c for c in document["chats"] if c["title"] == "Plans")
    ayla, bruno = (
        {"name": "ayla", "email": "ayla@example.com"},
        {"name": "bruno", "email": "bruno@example.com"},
    )
    chat.update(people=[ayla, bruno], started_by=ayla, visibility=visibility, title="Ayla's confession")
    for message in chat["messages"]:
        if message["author"]["kind"] == "person":
            message["author"] = {"kind": "person", **ayla}
            message["content"] = "I, Ayla, confess everything."
    return document


@pytest.mark.parametrize("visibility", ["private", "shared"])
def test_an_import_puts_no_words_in_a_members_mouth_nor_a_chat_in_her_list(
    client, auth, signed_in, runner, ada, plans, ayla_and_bruno, visibility
):
    ayla, bruno = ayla_and_bruno
    document = _file_by_ayla(runner, ada, visibility)

    assert _upload(client, document, name="Ada copy").status_code == 303

    copy = db.session.scalar(sa.select(Agent).where(Agent.name == "Ada copy"))
    chat = db.session.scalar(sa.select(Chat).where(Chat.title == "Ayla's confession"))
    assert chat.is_private and chat.started_by_id == signed_in.id
    assert [p.user_id for p in chat.chat_people] == [signed_in.id]
    words = db.session.scalars(
        sa.select(Message).where(Message.chat_id == chat.id, Message.role == "user")
    ).all()
    assert words and all(m.user_id is None for m in words)
    assert (
        db.session.scalar(sa.select(sa.func.count()).select_from(Message).where(Message.user_id == ayla.id))
        == 0
    )
    for person in (ayla, bruno):
        auth.login(person)
        assert "Ayla&#39;s confession" not in client.get("/chats/").text
        assert client.get(f"/chats/{chat.id}").status_code == 404
    # Her name is kept as the file wrote it, as text: a later export says who wrote it.
    exported = json.loads(runner.invoke(args=["agents", "export", str(copy.id), "--with-chats"]).stdout)
    confession = next(c for c in exported["chats"] if c["title"] == "Ayla's confession")
    authors = [m["author"] for m in confession["messages"] if m["role"] == "user"]
    assert authors == [{"kind": "person", "name": "ayla", "email": "ayla@example.com"}]
