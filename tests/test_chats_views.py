"""The chat pages as a person uses them: full pages, HTMX fragments, and bad input."""

import re

import pytest
import sqlalchemy as sa

from tests import factories
from webapp.extensions import db
from webapp.jobs.queue import rq_queue
from webapp.models import Chat, Message


@pytest.fixture
def ada(admin):
    return factories.agent(admin.account, "Ada")


@pytest.fixture
def basil(admin):
    return factories.agent(admin.account, "Basil")


def _queued_message_ids() -> list[list[int]]:
    """The message ids of the queued reply jobs (summary jobs, spec 003, are queued alongside)."""
    return [job.args[0] for job in rq_queue("replies").get_jobs() if job.func_name.endswith(".respond")]


def _messages(chat) -> list[Message]:
    db.session.expire_all()
    return list(db.session.scalars(sa.select(Message).where(Message.chat_id == chat.id).order_by(Message.id)))


def test_chat_list_shows_participants_and_latest_activity_first(client, signed_in, ada, basil):
    older = factories.chat(signed_in.account, [ada], "Tea")
    newer = factories.chat(signed_in.account, [ada, basil], "Plans")
    factories.message(older, "hello", author=signed_in)  # now the most recently active

    page = client.get("/chats/")
    fragment = client.get("/chats/", headers={"HX-Request": "true", "HX-Target": "chat-list"})

    assert page.text.index("Tea") < page.text.index("Plans")
    assert "with Ada, Basil" in page.text and "<html" in page.text
    assert fragment.text.lstrip().startswith('<ul id="chat-list"') and "<html" not in fragment.text
    assert f"/chats/{newer.id}" in fragment.text
    assert "HX-Request" in page.headers["Vary"]


def test_create_a_one_to_one_and_a_group_chat(client, signed_in, ada, basil):
    one = client.post("/chats/new", data={"title": "Just Ada", "agent_ids": [ada.id]})
    group = client.post("/chats/new", data={"agent_ids": [ada.id, basil.id]})

    assert one.status_code == group.status_code == 303
    chats = db.session.scalars(sa.select(Chat).order_by(Chat.id)).all()
    assert [(c.title, c.manual_responses, [a.name for a in c.agents]) for c in chats] == [
        ("Just Ada", False, ["Ada"]),
        ("", True, ["Ada", "Basil"]),
    ]


def test_a_chat_needs_an_agent_of_this_account(client, signed_in, ada, stranger):
    foreign = factories.agent(stranger.account, "Mallory")

    none_chosen = client.post("/chats/new", data={"title": "x"})
    foreign_chosen = client.post("/chats/new", data={"agent_ids": [foreign.id]})

    assert none_chosen.status_code == foreign_chosen.status_code == 422
    assert "Choose at least one agent." in none_chosen.text
    assert "not a valid choice" in foreign_chosen.text
    assert db.session.scalar(sa.select(sa.func.count()).select_from(Chat)) == 0


def test_chat_page_renders_markdown_and_escapes_html(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])
    factories.message(chat, "**bold** <script>alert(1)</script> [x](javascript:alert(2))", author=signed_in)
    factories.message(chat, "A *reply* with <img src=x onerror=alert(3)>", author=ada)

    page = client.get(f"/chats/{chat.id}").text

    assert "<strong>bold</strong>" in page and "<em>reply</em>" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page
    assert "<img" not in page and 'href="javascript' not in page
    assert "trigger-bar" not in page  # one-to-one: the agent answers by itself
    assert f'sse-connect="/chats/{chat.id}/stream"' in page


def test_group_chat_page_has_a_button_per_agent_and_ask_all(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada, basil])

    page = client.get(f"/chats/{chat.id}").text

    assert "Ask Ada" in page and "Ask Basil" in page and "Ask all" in page


def test_chat_page_loads_the_latest_messages_and_older_ones_on_demand(client, signed_in, ada, app):
    chat = factories.chat(signed_in.account, [ada])
    for i in range(120):
        chat.add_message(role="user", content=f"message number {i}", user=signed_in, status="done")
    db.session.commit()
    per_page = app.config["MESSAGES_PER_PAGE"]

    page = client.get(f"/chats/{chat.id}")
    fragment = client.get(f"/chats/{chat.id}", headers={"HX-Request": "true", "HX-Target": "messages"})
    pane = page.text.split('id="messages"')[1]
    first_shown = int(re.search(r"message number (\d+)", pane).group(1))
    older_url = re.search(r'hx-get="(/chats/\d+/messages\?before=\d+)"', page.text).group(1)
    older = client.get(older_url)

    assert first_shown == 120 - per_page
    assert page.text.count('class="message user') == per_page
    assert "<html" not in fragment.text and fragment.text.count('class="message user') == per_page
    assert older.text.count('class="message user') == per_page
    assert f"message number {120 - 2 * per_page}<" in older.text and "Load older messages" in older.text


def test_sending_in_a_one_to_one_chat_asks_the_agent(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])

    response = client.post(
        f"/chats/{chat.id}/messages", data={"content": "  Hello Ada  "}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 200
    posted, placeholder = _messages(chat)
    assert (posted.role, posted.content, posted.user_id) == ("user", "Hello Ada", signed_in.id)
    assert (placeholder.role, placeholder.agent_id, placeholder.status) == ("assistant", ada.id, "pending")
    assert _queued_message_ids() == [[placeholder.id]]
    assert "Ada will answer in turn" in response.text
    assert 'id="composer"' not in response.text  # the page clears the composer itself, keeping the focus


def test_mentions_ask_the_named_agents_in_order(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada, basil])

    client.post(
        f"/chats/{chat.id}/messages", data={"content": "@basil first, then @Ada. Not @Adam or me@ada.com"}
    )

    _, first, second = _messages(chat)
    assert [first.agent_id, second.agent_id] == [basil.id, ada.id]
    assert _queued_message_ids() == [[first.id, second.id]]


def test_a_group_chat_message_without_mentions_asks_nobody(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada, basil])

    client.post(f"/chats/{chat.id}/messages", data={"content": "Just thinking aloud"})

    assert [m.role for m in _messages(chat)] == ["user"]
    assert _queued_message_ids() == []


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("   ", "Write a message first."),
        ("x" * 20_001, "That message has 20,001 characters; the limit is 20,000."),
    ],
)
def test_an_empty_or_oversized_message_is_refused_and_kept_in_the_composer(
    client, signed_in, ada, content, error
):
    chat = factories.chat(signed_in.account, [ada])

    response = client.post(
        f"/chats/{chat.id}/messages", data={"content": content}, headers={"HX-Request": "true"}
    )

    assert response.status_code == 422
    assert error in response.text
    assert response.headers["HX-Retarget"] == "#composer"
    assert content.strip()[:100] in response.text  # nothing the person typed is lost
    assert _messages(chat) == []


def test_a_message_of_exactly_20000_characters_is_accepted(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])

    assert client.post(f"/chats/{chat.id}/messages", data={"content": "y" * 20_000}).status_code == 200


def test_trigger_one_agent_or_all_in_order(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada, basil])

    client.post(f"/chats/{chat.id}/trigger", data={"agent_id": basil.id})
    client.post(f"/chats/{chat.id}/trigger", data={"agent_id": "all"})

    replies = _messages(chat)
    assert [m.agent_id for m in replies] == [basil.id, ada.id, basil.id]
    assert _queued_message_ids() == [[replies[0].id], [replies[1].id, replies[2].id]]


def test_trigger_for_an_agent_not_in_the_chat_or_paused_is_refused(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada], manual=True)
    paused = factories.agent(signed_in.account, "Zed", paused=True)
    from webapp.models import ChatAgent

    db.session.add(ChatAgent(chat=chat, agent=paused))
    db.session.commit()

    outsider = client.post(f"/chats/{chat.id}/trigger", data={"agent_id": basil.id})
    sleeping = client.post(f"/chats/{chat.id}/trigger", data={"agent_id": paused.id})
    unknown = client.post(f"/chats/{chat.id}/trigger", data={"agent_id": "999999"})

    assert outsider.status_code == unknown.status_code == 422
    assert "That agent is not in this chat." in outsider.text and outsider.headers["HX-Retarget"] == "#notice"
    assert (sleeping.status_code, "Zed is paused." in sleeping.text) == (422, True)
    assert _messages(chat) == [] and _queued_message_ids() == []


def test_retry_a_failed_reply(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])
    failed = factories.message(
        chat, "", author=ada, status="failed", error="The model returned HTTP 400: bad"
    )
    finished = factories.message(chat, "fine", author=ada)

    page = client.get(f"/chats/{chat.id}").text
    retried = client.post(f"/chats/{chat.id}/messages/{failed.id}/retry")
    refused = client.post(f"/chats/{chat.id}/messages/{finished.id}/retry")

    assert "The reply failed: The model returned HTTP 400: bad" in page and "Retry" in page
    assert retried.status_code == 200 and "Ada will answer in turn" in retried.text
    assert refused.status_code == 422
    db.session.refresh(failed)
    assert (failed.status, failed.error) == ("pending", None)
    assert _queued_message_ids() == [[failed.id]]


def test_an_unfinished_reply_answers_204_until_its_state_changes(client, signed_in, ada):
    """The page polls with the state it shows: a reply that started streaming, or finished, before its live
    event could reach the page is shown all the same."""
    chat = factories.chat(signed_in.account, [ada])
    reply = factories.message(chat, "", author=ada, status="pending")
    pending_url = f"/chats/{chat.id}/messages/{reply.id}?shown=pending"
    page = client.get(f"/chats/{chat.id}").text

    assert f'hx-get="/chats/{chat.id}/messages/{reply.id}?shown=pending" hx-trigger="load, every 4s"' in page
    assert client.get(pending_url).status_code == 204
    reply.status = "streaming"
    db.session.commit()
    streaming = client.get(pending_url)
    assert streaming.status_code == 200 and f'sse-swap="delta-{reply.id}"' in streaming.text
    assert "?shown=streaming" in streaming.text
    assert client.get(f"/chats/{chat.id}/messages/{reply.id}?shown=streaming").status_code == 204
    reply.status, reply.content = "done", "All done"
    db.session.commit()
    assert "All done" in client.get(f"/chats/{chat.id}/messages/{reply.id}?shown=streaming").text


def test_rename_add_an_agent_discard_and_restore(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada])

    renamed = client.post(
        f"/chats/{chat.id}/rename", data={"title": "Tea talk"}, headers={"HX-Request": "true"}
    )
    added = client.post(f"/chats/{chat.id}/agents", data={"agent_id": basil.id})
    again = client.post(f"/chats/{chat.id}/agents", data={"agent_id": basil.id})

    assert 'value="Tea talk"' in renamed.text and "<html" not in renamed.text
    assert added.status_code == 303 and again.status_code == 422
    db.session.refresh(chat)
    assert chat.manual_responses and [a.name for a in chat.agents] == ["Ada", "Basil"]
    assert [(m.role, m.content) for m in _messages(chat)] == [("system", "Basil joined the conversation.")]

    assert client.post(f"/chats/{chat.id}/discard").status_code == 303
    assert "Tea talk" not in client.get("/chats/").text
    assert "Tea talk" in client.get("/chats/?discarded=1").text
    assert client.post(f"/chats/{chat.id}/messages", data={"content": "hi"}).status_code == 409
    assert client.post(f"/chats/{chat.id}/restore").status_code == 303
    assert "Tea talk" in client.get("/chats/").text


def test_a_title_over_200_characters_is_refused(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada], "Keep")

    response = client.post(f"/chats/{chat.id}/rename", data={"title": "t" * 201})

    assert response.status_code == 422
    db.session.refresh(chat)
    assert chat.title == "Keep"


def test_ask_all_with_a_draft_sends_the_draft_first(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada, basil])

    response = client.post(f"/chats/{chat.id}/messages", data={"content": "Who cooks?", "ask": "all"})

    posted, first, second = _messages(chat)
    assert (posted.role, posted.content) == ("user", "Who cooks?")
    assert [first.agent_id, second.agent_id] == [ada.id, basil.id]
    assert _queued_message_ids() == [[first.id, second.id]]
    assert "Nobody was asked" not in response.text


def test_an_ask_button_with_a_mention_asks_both_and_an_empty_draft_only_asks(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada, basil])

    client.post(f"/chats/{chat.id}/messages", data={"content": "@Basil and you?", "ask": str(ada.id)})
    client.post(f"/chats/{chat.id}/messages", data={"content": "  ", "ask": str(ada.id)})

    roles = [(m.role, m.agent_id) for m in _messages(chat)]
    assert roles == [("user", None), ("assistant", basil.id), ("assistant", ada.id), ("assistant", ada.id)]


def test_a_group_message_asking_nobody_gets_a_hint(client, signed_in, ada, basil):
    chat = factories.chat(signed_in.account, [ada, basil])

    response = client.post(f"/chats/{chat.id}/messages", data={"content": "Hello all"})

    assert "Nobody was asked to reply" in response.text and "@Ada" in response.text
    assert _queued_message_ids() == []


def test_stop_a_queued_reply_and_regenerate_the_last_one(client, signed_in, ada, app):
    chat = factories.chat(signed_in.account, [ada])
    factories.message(chat, "hi", author=signed_in)
    queued = factories.message(chat, "", author=ada, status="pending")

    stopped = client.post(f"/chats/{chat.id}/messages/{queued.id}/stop")

    db.session.refresh(queued)
    assert (queued.status, queued.error) == ("failed", "Stopped before it began.")
    assert "Stopped before it began." in stopped.text and "Retry" in stopped.text
    assert app.extensions["redis"].exists(f"cairn:stop:{queued.id}")

    queued.status, queued.content, queued.error = "done", "Hello!", None
    db.session.commit()
    regenerated = client.post(f"/chats/{chat.id}/messages/{queued.id}/regenerate")

    db.session.refresh(queued)
    assert (queued.status, queued.content) == ("pending", "")
    assert _queued_message_ids() == [[queued.id]]
    assert not app.extensions["redis"].exists(f"cairn:stop:{queued.id}")  # Stop no longer applies
    assert "Ada will answer in turn" in regenerated.text


def test_only_the_last_reply_can_be_regenerated(client, signed_in, ada):
    chat = factories.chat(signed_in.account, [ada])
    earlier = factories.message(chat, "first answer", author=ada)
    factories.message(chat, "later", author=signed_in)

    response = client.post(f"/chats/{chat.id}/messages/{earlier.id}/regenerate")

    assert response.status_code == 422 and _queued_message_ids() == []


def test_edit_your_last_message_replaces_its_replies(client, signed_in, ada, member):
    chat = factories.chat(signed_in.account, [ada])
    mine = factories.message(chat, "Plan a trip to Lisbn", author=signed_in)
    old_reply = factories.message(chat, "Lisbn?", author=ada)

    form = client.get(f"/chats/{chat.id}/messages/{mine.id}/edit")
    response = client.post(
        f"/chats/{chat.id}/messages/{mine.id}/edit", data={"content": "Plan a trip to Lisbon"}
    )

    assert "Plan a trip to Lisbn" in form.text and "Save and resend" in form.text
    edited, new_reply = _messages(chat)
    assert (edited.id, edited.content) == (mine.id, "Plan a trip to Lisbon")
    assert (new_reply.agent_id, new_reply.status) == (ada.id, "pending") and new_reply.id != old_reply.id
    assert f'id="message-{old_reply.id}" hx-swap-oob="delete"' in response.text
    assert _queued_message_ids() == [[new_reply.id]]


def test_only_your_own_last_message_can_be_edited(client, auth, admin, member, ada):
    chat = factories.chat(admin.account, [ada])
    theirs = factories.message(chat, "admin's words", author=admin)
    first = factories.message(chat, "my first", author=member)
    factories.message(chat, "my second", author=member)
    auth.login(member)

    assert client.get(f"/chats/{chat.id}/messages/{theirs.id}/edit").status_code == 409
    assert client.post(f"/chats/{chat.id}/messages/{first.id}/edit", data={"content": "x"}).status_code == 409
    assert [m.content for m in _messages(chat)] == ["admin's words", "my first", "my second"]


def test_a_notice_leaves_edit_and_regenerate_with_the_last_turn(client, signed_in, ada, member):
    chat = factories.chat(signed_in.account, [ada])
    mine = factories.message(chat, "Plan a trip to Lisbn", author=signed_in)
    reply = factories.message(chat, "Lisbn?", author=ada)
    notice = factories.message(chat, "dana added milo to the conversation.", role="system")

    regenerated = client.post(f"/chats/{chat.id}/messages/{reply.id}/regenerate")
    form = client.get(f"/chats/{chat.id}/messages/{mine.id}/edit")
    db.session.refresh(reply)
    reply.status, reply.content = "done", "Lisbon?"
    db.session.commit()
    client.post(f"/chats/{chat.id}/messages/{mine.id}/edit", data={"content": "Plan a trip to Lisbon"})

    assert regenerated.status_code == 200 and form.status_code == 200 and "Save and resend" in form.text
    edited, kept, new_reply = _messages(chat)
    assert (edited.id, edited.content) == (mine.id, "Plan a trip to Lisbon")
    assert (kept.id, kept.content) == (notice.id, "dana added milo to the conversation.")  # it still happened
    assert new_reply.role == "assistant" and new_reply.id > notice.id


def test_an_agents_memory_from_the_chat_read_only_for_members(client, auth, admin, member, ada, basil):
    from webapp.models import AgentMemory

    chat = factories.chat(admin.account, [ada])
    db.session.add_all(
        [
            AgentMemory(agent=ada, content="Dana prefers window seats.", memory_type="core"),
            AgentMemory(agent=ada, content="Dana flies on Monday.", memory_type="journal"),
            AgentMemory(agent=basil, content="Basil's own secret.", memory_type="core"),
        ]
    )
    db.session.commit()
    auth.login(member)

    page = client.get(f"/chats/{chat.id}/agents/{ada.id}/memory")
    outside = client.get(f"/chats/{chat.id}/agents/{basil.id}/memory")  # Basil is not in this chat

    assert "Dana prefers window seats." in page.text and "Dana flies on Monday." in page.text
    assert "Basil's own secret." not in page.text
    assert "memory ledger" not in page.text and "<form" not in page.text.split("<main")[1]  # read-only
    assert outside.status_code == 404
    assert f'/chats/{chat.id}/agents/{ada.id}/memory"' in client.get(f"/chats/{chat.id}").text


@pytest.mark.parametrize(
    ("setting", "core_shown", "journal_shown"),
    [("prompt", True, True), ("core", True, False), ("none", False, False)],
)
def test_members_see_of_an_agents_memory_what_its_admin_lets_them(
    app, client, auth, admin, member, ada, setting, core_shown, journal_shown
):
    from webapp.models import AgentMemory

    app.config["MEMORY_TOKEN_BUDGET"] = 250
    ada.members_see_memory = setting
    chat = factories.chat(admin.account, [ada])
    db.session.add_all(
        [AgentMemory(agent=ada, content=f"Core fact {i} about Dana.", memory_type="core") for i in range(3)]
        + [
            AgentMemory(agent=ada, content=f"Journal note {i}: Dana flies on Monday.", memory_type="journal")
            for i in range(30)
        ]
    )
    db.session.commit()
    auth.login(member)

    page = " ".join(client.get(f"/chats/{chat.id}/agents/{ada.id}/memory").text.split())

    assert ("Core fact 0 about Dana." in page) is core_shown
    assert ("Dana flies on Monday." in page) is journal_shown
    assert ("journal" in page.split("<main")[1].lower()) is journal_shown  # not even how many entries
    assert ("not to show" in page) is (setting == "none")
    client.post("/logout")
    auth.login(admin)  # admins always see all the prompt holds
    page = client.get(f"/chats/{chat.id}/agents/{ada.id}/memory").text
    assert "Core fact 0 about Dana." in page and "Dana flies on Monday." in page


@pytest.mark.parametrize(
    ("setting", "core_chip_shown", "journal_chip_shown"),
    [("prompt", True, True), ("core", True, False), ("none", False, False)],
)
def test_a_saved_memory_chip_shows_members_only_what_the_agents_admin_lets_them(
    client, auth, admin, member, ada, setting, core_chip_shown, journal_chip_shown
):
    """The chip under a reply quotes what the agent saved; a member whom the agent's admin does not let see
    that kind of memory reads only that something was saved, with no quote and no link to the memory."""
    from webapp.tools import steps

    ada.members_see_memory = setting
    chat = factories.chat(admin.account, [ada])
    reply = factories.message(chat, "Noted both.", author=ada)
    reply.tools_used = [
        steps.finished("save_memory", {"content": f"Dana {kind} fact.", "memory_type": kind}, result, 0)
        for kind, result in (
            ("core", {"saved": True, "memory_id": 1}),
            ("journal", {"saved": True, "memory_id": 2}),
        )
    ]
    db.session.commit()

    auth.login(member)
    page = client.get(f"/chats/{chat.id}").text
    assert ("Dana core fact." in page) is core_chip_shown
    assert ("#memory-1" in page) is core_chip_shown
    assert ("Dana journal fact." in page) is journal_chip_shown
    assert ("#memory-2" in page) is journal_chip_shown
    assert page.count("Saved a memory") == (not core_chip_shown) + (not journal_chip_shown)
    client.post("/logout")
    auth.login(admin)
    page = client.get(f"/chats/{chat.id}").text
    assert "Dana core fact." in page and "Dana journal fact." in page


def test_an_agents_memory_page_shows_what_its_prompt_holds_and_what_did_not_fit(app, client, signed_in, ada):
    from webapp.models import AgentMemory
    from webapp.prompting.build import build_prompt

    app.config["MEMORY_TOKEN_BUDGET"] = 200
    chat = factories.chat(signed_in.account, [ada])
    db.session.add_all(
        [
            AgentMemory(agent=ada, content=f"Core fact {i} about the garden.", memory_type="core")
            for i in range(20)
        ]
        + [
            AgentMemory(agent=ada, content=f"Journal note {i} about the roses.", memory_type="journal")
            for i in range(20)
        ]
    )
    db.session.commit()

    page = " ".join(client.get(f"/chats/{chat.id}/agents/{ada.id}/memory").text.split())

    held = build_prompt(chat, ada).sources.memory_ids
    assert [int(i) for i in re.findall(r'id="memory-(\d+)"', page)] == held and 0 < len(held) < 40
    core_out = 20 - sum(1 for i in held if db.session.get(AgentMemory, i).memory_type == "core")
    assert f"{core_out} core memories and {40 - len(held) - core_out} journal entries did not fit" in page


def test_chat_page_lists_the_chats_with_a_preview_and_focuses_the_composer(client, signed_in, ada):
    tea = factories.chat(signed_in.account, [ada], "Tea")
    factories.message(
        tea, "**Green** or _black_?\n\n- [Assam](https://example.com) & `Earl Grey`", author=ada
    )
    plans = factories.chat(signed_in.account, [ada], "Plans")

    page = client.get(f"/chats/{plans.id}").text
    index = client.get("/chats/").text

    sidebar = page.split('class="chat-sidebar"')[1].split("</nav>")[0]
    plain = "Ada: Green or black? Assam &amp; Earl Grey"  # the words, not their Markdown
    assert "Tea" in sidebar and f'<span class="preview">{plain}</span>' in sidebar and "New chat" in sidebar
    assert f'<span class="preview muted">{plain}</span>' in index
    assert 'aria-current="page"' in sidebar.split("Plans")[0].rsplit("<li>", 1)[1]
    assert '<h1 id="chat-heading">Plans</h1>' in page
    assert 'id="composer-input"' in page and "autofocus" in page
    assert 'tabindex="0" role="region" aria-label="Conversation"' in page and 'role="status"' in page


def test_a_person_chooses_the_name_others_see_on_their_messages(client, auth, admin, member, ada):
    from webapp.prompting.build import build_prompt

    chat = factories.chat(admin.account, [ada])
    auth.login(member)
    assert 'name="name"' in client.get("/account").text

    saved = client.post("/account/name", data={"name": "  Milo   Park "})
    taken = client.post("/account/name", data={"name": "ada"})
    factories.message(chat, "Hello from Milo.", author=member)

    assert saved.status_code == 303 and taken.status_code == 422
    assert "Ada is an agent&#39;s name" in taken.text
    mine = client.get(f"/chats/{chat.id}").text
    assert re.search(r'<strong class="author">You</strong>', mine)  # to the author, still "You"
    client.post("/logout")
    auth.login(admin)
    page = client.get(f"/chats/{chat.id}").text
    assert '<strong class="author">Milo Park</strong>' in page and "milo</strong>" not in page
    prompt = build_prompt(chat, ada).messages
    assert {"role": "user", "content": "Milo Park: Hello from Milo."} in prompt
    assert "Milo Park (person)" in prompt[-1]["content"]
    client.post("/logout")
    auth.login(member)
    client.post("/account/name", data={"name": ""})  # back to the e-mail's local part
    db.session.expire_all()
    assert member.display_name == "milo"


def test_the_name_form_needs_the_csrf_token(app, client, auth, member):
    auth.login(member)
    app.config["WTF_CSRF_ENABLED"] = True  # the other tests switch it off
    page = client.get("/account").text
    token = re.search(r'id="name-csrf_token" name="csrf_token" type="hidden" value="([^"]+)"', page).group(1)

    refused = client.post("/account/name", data={"name": "Milo"})
    saved = client.post("/account/name", data={"name": "Milo", "csrf_token": token})

    assert (refused.status_code, saved.status_code) == (400, 303)
