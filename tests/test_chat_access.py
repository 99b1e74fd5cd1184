"""Whose chat it is (issue 21): a private chat is read by its people only, on every route, GET and POST alike;
new chats are private to whoever started them; its people share it, make it private again and add the account's
people; admins do not read members' private chats; the lists mark private and shared chats; conversation ids
look random."""

import re
import threading
import time
from difflib import SequenceMatcher

import pytest
import sqlalchemy as sa
from flask import g
from werkzeug.test import Client

from tests import factories
from tests.conftest import Auth, wait_for
from webapp import events
from webapp.extensions import db
from webapp.jobs.queue import rq_queue
from webapp.models import AuditLog, Chat, ChatAgent, ChatPerson, Message, ReplySources, User, public_ids
from webapp.timeutil import utcnow

SECRET = "PLUM-7731"
TITLE = "Ayla notes 4417"


@pytest.fixture(autouse=True)
def _each_request_signs_in_afresh(app):
    """The test's app context, and so `g`, outlives each request: forget whom the last request signed in (as a
    server's fresh context for each request does), so that two people's clients can take turns."""

    @app.before_request
    def _forget_the_last_user() -> None:
        g.pop("_login_user", None)


@pytest.fixture
def ada(acme):
    return factories.agent(acme, "Ada", enabled_tools=["save_memory", "borrow_context"])


@pytest.fixture
def sam(acme):
    """Member B (the `member` fixture, Milo, is member A)."""
    return factories.user(acme, "sam@example.com", "member")


@pytest.fixture
def a_private(acme, member, ada):
    """A's private chat with Ada: A's words, a failed reply (retry) and a finished last reply (regenerate)."""
    chat = factories.chat(acme, [ada], TITLE, people=[member])
    factories.message(chat, f"my locker code is {SECRET}", author=member)
    factories.message(chat, "", author=ada, status="failed", error="model down")
    last = factories.message(chat, f"Noted again: {SECRET}.", author=ada)
    factories.summary(chat, ada, f"Milo's locker code is {SECRET}.")
    db.session.add(ReplySources(message_id=last.id, conversation_summary=True))  # its admin page has a row
    db.session.commit()
    return chat


def _snapshot(chat_id: int) -> dict:
    """Everything of the chat that a route could change, read on a connection of its own (committed rows)."""
    with db.engine.connect() as conn:

        def rows(*columns, where):
            return [tuple(r) for r in conn.execute(sa.select(*columns).where(where).order_by(*columns[:2]))]

        return {
            "chat": rows(
                Chat.id, Chat.title, Chat.visibility, Chat.started_by_id, Chat.discarded_at,
                Chat.manual_responses, Chat.memory_doc, Chat.last_message_at, where=Chat.id == chat_id,
            ),
            "people": rows(ChatPerson.chat_id, ChatPerson.user_id, where=ChatPerson.chat_id == chat_id),
            "agents": rows(
                ChatAgent.chat_id, ChatAgent.agent_id, ChatAgent.agent_summary, ChatAgent.borrowed_context_json,
                where=ChatAgent.chat_id == chat_id,
            ),
            "messages": rows(
                Message.chat_id, Message.id, Message.role, Message.content, Message.status, Message.error,
                Message.user_id, Message.agent_id, where=Message.chat_id == chat_id,
            ),
            "audit": conn.scalar(sa.select(sa.func.count()).select_from(AuditLog)),
            "queued": rq_queue().count,
        }  # fmt: skip


def _routes_with_a_chat_or_message(app) -> list:
    rules = [r for r in app.url_map.iter_rules() if {"chat_id", "message_id"} & set(r.arguments)]
    assert {r.endpoint for r in rules} >= {"chats.show", "chats.send", "chats.stream", "chats.visibility"}
    return rules


def _url(app, rule, values: dict) -> str:
    unknown = set(rule.arguments) - values.keys()
    assert not unknown, f"the sweep cannot fill {unknown} of {rule.rule}: teach it, so the route is swept too"
    with app.test_request_context():
        return app.url_for(rule.endpoint, **{k: values[k] for k in rule.arguments})


def _sweep(app, client, chat: Chat, values: dict, form: dict) -> list[tuple[str, str, int, str]]:
    """Every route that takes a chat or message id, with each of its methods (GET, POST): each answer."""
    answers = []
    for rule in _routes_with_a_chat_or_message(app):
        url = _url(app, rule, values)
        for method in sorted(rule.methods & {"GET", "POST"}):
            query = "?seconds=1&before=999999&edit=1" if method == "GET" else ""
            response = client.open(url + query, method=method, data=form if method == "POST" else None)
            answers.append((rule.endpoint, method, response.status_code, response.get_data(as_text=True)))
            response.close()
            db.session.rollback()  # the test's session is the views' own: drop anything a view left in it
    return answers


@pytest.fixture
def sweep_values(a_private, ada, sam):
    last = db.session.scalar(sa.select(sa.func.max(Message.id)).where(Message.chat_id == a_private.id))
    memory = factories.memory(ada, f"Milo's locker code is {SECRET}.", chat_id=a_private.id)
    values = {
        "chat_id": a_private.id,
        "message_id": last,
        "agent_id": ada.id,
        "user_id": sam.id,
        "memory_id": memory.id,
    }
    form = {
        "content": "hi",
        "ask": "all",
        "agent_id": ada.id,
        "title": "pwned",
        "visibility": "shared",
        "user_id": sam.id,
        "memory_doc": "pwned",
    }
    return values, form


def test_every_route_with_a_chat_or_message_id_is_a_404_for_another_member(
    app, client, auth, a_private, sam, sweep_values
):
    values, form = sweep_values
    before = _snapshot(a_private.id)
    auth.login(sam)

    answers = _sweep(app, client, a_private, values, form)

    wrong = [(e, m, s) for e, m, s, _ in answers if s != (403 if e.startswith("admin.") else 404)]
    assert wrong == [], "answered other than not found (or, for an admin page, forbidden to a member)"
    assert not [(e, m) for e, m, _, text in answers if SECRET in text or TITLE in text]
    assert len(answers) >= 20
    assert _snapshot(a_private.id) == before


def test_the_sweep_reaches_the_chat_when_its_person_asks(app, client, auth, member, a_private, sweep_values):
    values, form = sweep_values
    auth.login(member)

    answers = _sweep(app, client, a_private, values, form)

    gets = {
        e: s for e, m, s, _ in answers if m == "GET" and e.startswith("chats.") and e != "chats.edit_message"
    }
    assert set(gets.values()) == {200}, gets


def test_the_admin_does_not_read_a_members_private_chat_on_any_route(
    app, client, auth, admin, a_private, sweep_values
):
    values, form = sweep_values
    before = _snapshot(a_private.id)
    auth.login(admin)

    answers = _sweep(app, client, a_private, values, form)

    # An admin page about a reply (its sources: memories, which admins govern) may answer, without the chat.
    wrong = [(e, m, s) for e, m, s, _ in answers if s != 404 and not (e.startswith("admin.") and s == 200)]
    assert wrong == []
    assert not [(e, m) for e, m, _, text in answers if SECRET in text or TITLE in text]
    assert _snapshot(a_private.id) == before
    assert TITLE not in client.get("/chats/").text


def test_the_stream_of_a_private_chat_is_a_404_for_another_member(client, auth, a_private, sam):
    auth.login(sam)

    assert client.get(f"/chats/{a_private.id}/stream?seconds=1").status_code == 404
    assert events.open_stream_count(sam.id) == 0


def test_a_reads_their_own_private_chat(client, auth, member, a_private):
    auth.login(member)

    page = client.get(f"/chats/{a_private.id}")
    stream = client.get(f"/chats/{a_private.id}/stream?seconds=1")

    assert page.status_code == 200 and SECRET in page.text and TITLE in page.text
    assert stream.status_code == 200
    assert TITLE in client.get("/chats/").text


def test_sharing_makes_a_chat_readable_by_the_account_and_private_again_hides_it(
    app, client, auth, member, sam, a_private
):
    a = auth
    b = Auth(app.test_client())
    a.login(member)
    b.login(sam)
    url = f"/chats/{a_private.id}"

    shared = a.client.post(f"{url}/visibility", data={"visibility": "shared"})

    assert shared.status_code == 303 and shared.location.endswith(url)
    assert b.client.get(url).status_code == 200 and SECRET in b.client.get(url).text
    assert TITLE in b.client.get("/chats/").text
    notice = db.session.scalar(
        sa.select(Message).where(Message.chat_id == a_private.id).order_by(Message.id.desc())
    )
    assert (notice.role, notice.content) == ("system", "milo opened this chat to everyone in Acme.")

    a.client.post(f"{url}/visibility", data={"visibility": "private"})

    assert b.client.get(url).status_code == 404
    assert TITLE not in b.client.get("/chats/").text
    assert db.session.get(Chat, a_private.id).visibility == "private"


def test_only_its_people_flip_a_chat_and_only_an_admin_one_from_before_people_and_joins_it(
    client, auth, acme, member, sam, ada, a_private
):
    auth.login(sam)
    a_private.visibility = "shared"
    db.session.commit()

    assert client.post(f"/chats/{a_private.id}/visibility", data={"visibility": "private"}).status_code == 403
    assert client.post(f"/chats/{a_private.id}/people", data={"user_id": sam.id}).status_code == 403
    assert db.session.get(Chat, a_private.id).visibility == "shared"
    assert "Who can read this chat" not in client.get(f"/chats/{a_private.id}").text

    # Shared, with no people: everyone reads it, so a member may not hide it from the others; an admin may, and
    # becomes its person.
    older = factories.chat(acme, [ada], "From before")
    assert client.post(f"/chats/{older.id}/visibility", data={"visibility": "private"}).status_code == 403
    assert client.post(f"/chats/{older.id}/people", data={"user_id": member.id}).status_code == 403
    db.session.expire_all()
    assert (
        db.session.get(Chat, older.id).visibility == "shared"
        and not db.session.get(Chat, older.id).chat_people
    )
    admin = factories.user(acme, "ada-admin@example.com", "admin")
    auth.login(admin)
    client.post(f"/chats/{older.id}/visibility", data={"visibility": "private"})

    db.session.expire_all()
    assert db.session.get(Chat, older.id).visibility == "private"
    assert [p.user_id for p in db.session.get(Chat, older.id).chat_people] == [admin.id]
    assert client.get(f"/chats/{older.id}").status_code == 200


def test_the_new_chat_form_says_who_will_read_it(client, auth, member, ada):
    auth.login(member)

    form = " ".join(client.get("/chats/new").text.split())

    assert "<strong>Who reads it: only its people</strong>, that is you until you add someone." in form
    assert "In the chat, you can add people or open it to everyone in Acme." in form


def test_a_new_chat_is_private_to_whoever_started_it(app, client, auth, member, sam, ada):
    auth.login(member)

    response = client.post("/chats/new", data={"title": "Mine", "agent_ids": [ada.id]})

    chat = db.session.scalar(sa.select(Chat).where(Chat.title == "Mine"))
    assert response.status_code == 303
    assert (chat.visibility, chat.started_by_id) == ("private", member.id)
    assert [(p.user_id, p.added_by_id) for p in chat.chat_people] == [(member.id, member.id)]
    b = Auth(app.test_client())
    b.login(sam)
    assert b.client.get(f"/chats/{chat.id}").status_code == 404
    assert "Mine" not in b.client.get("/chats/").text


def test_adding_b_with_the_picker_makes_the_private_chat_readable_by_b(
    app, client, auth, member, sam, a_private
):
    auth.login(member)
    page = client.get(f"/chats/{a_private.id}").text
    picker = re.search(r'<select id="add-person" name="user_id">(.*?)</select>', page, re.S).group(1)
    assert ">sam</option>" in picker and ">milo</option>" not in picker

    response = client.post(f"/chats/{a_private.id}/people", data={"user_id": sam.id})

    assert response.status_code == 303
    assert [p.user_id for p in db.session.get(Chat, a_private.id).chat_people] == [member.id, sam.id]
    b = Auth(app.test_client())
    b.login(sam)
    assert SECRET in b.client.get(f"/chats/{a_private.id}").text
    assert "milo added sam to the conversation." in b.client.get(f"/chats/{a_private.id}").text
    assert db.session.get(Chat, a_private.id).visibility == "private"


def test_the_picker_adds_only_the_accounts_active_people_not_yet_in_the_chat(
    client, auth, member, sam, stranger, a_private
):
    removed = factories.user(member.account, "gone@example.com", "member")
    removed.removed_at = utcnow()
    db.session.commit()
    auth.login(member)
    picker = client.get(f"/chats/{a_private.id}").text

    for who in (removed, stranger, member, 999_999):
        user_id = getattr(who, "id", who)
        response = client.post(
            f"/chats/{a_private.id}/people", data={"user_id": user_id}, follow_redirects=True
        )
        assert "That person cannot be added to this chat." in response.text

    assert "gone</option>" not in picker and "eve</option>" not in picker
    assert [p.user_id for p in db.session.get(Chat, a_private.id).chat_people] == [member.id]


def test_people_are_taken_out_but_not_the_starter_nor_the_last_one(app, client, auth, member, sam, a_private):
    factories.add_person(a_private, sam)
    b = Auth(app.test_client())
    b.login(sam)
    url = f"/chats/{a_private.id}/people"

    refused = b.client.post(f"{url}/{member.id}/remove", follow_redirects=True)
    left = b.client.post(f"{url}/{sam.id}/remove")

    assert "Whoever started a chat stays in it." in refused.text
    assert left.status_code == 303 and left.location.endswith("/chats/")
    assert b.client.get(f"/chats/{a_private.id}").status_code == 404
    assert [p.user_id for p in db.session.get(Chat, a_private.id).chat_people] == [member.id]

    auth.login(member)
    factories.add_person(a_private, sam)
    assert client.post(f"{url}/{sam.id}/remove").status_code == 303
    assert client.post(f"{url}/{sam.id}/remove").status_code == 404  # no longer one of its people
    assert b.client.get(f"/chats/{a_private.id}").status_code == 404


def test_the_lists_show_only_readable_chats_marked_private_or_shared(
    client, auth, acme, member, sam, ada, a_private
):
    shared = factories.chat(acme, [ada], "Garden club")
    theirs = factories.chat(acme, [ada], "Sam's diary", people=[sam])
    auth.login(member)

    index = client.get("/chats/").text
    sidebar = client.get(f"/chats/{shared.id}").text.split('id="side-list"')[1].split("</ul>")[0]

    assert "Sam's diary" not in index and "Sam&#39;s diary" not in sidebar
    for html in (index, sidebar):
        private_row = re.search(rf"{TITLE}.*?</a>", html, re.S).group(0)
        shared_row = re.search(r"Garden club.*?</a>", html, re.S).group(0)
        # Named by who reads them, in words on the page (not "Shared": elsewhere a read-only link).
        assert (
            'class="visibility-mark private"' in private_row
            and '"audience">Only its people</span>' in private_row
        )
        assert (
            'class="visibility-mark shared"' in shared_row
            and '"audience">Everyone in Acme</span>' in shared_row
        )
    assert client.get(f"/chats/{theirs.id}").status_code == 404


def test_the_chat_header_has_the_switch_and_the_people(client, auth, member, sam, a_private):
    factories.add_person(a_private, sam)
    auth.login(member)

    page = client.get(f"/chats/{a_private.id}").text
    head = page.split('<header class="chat-head">')[1].split("</header>")[0]

    assert f'action="/chats/{a_private.id}/visibility"' in head and 'name="csrf_token"' in head
    assert re.search(r'value="private" aria-pressed="true"[^>]*>.*?Only its people</button>', head, re.S)
    assert re.search(r'value="shared" aria-pressed="false"[^>]*>.*?Everyone in Acme</button>', head, re.S)
    assert 'milo <span class="muted">(you)</span>' in head and "sam" in head
    assert f'action="/chats/{a_private.id}/people/{sam.id}/remove"' in head
    assert f'/people/{member.id}/remove"' not in head  # whoever started it stays


def test_the_switch_and_the_picker_need_the_csrf_token(app, client, auth, member, sam, a_private):
    auth.login(member)
    app.config["WTF_CSRF_ENABLED"] = True  # the other tests switch it off
    page = client.get(f"/chats/{a_private.id}").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    url = f"/chats/{a_private.id}"

    refused = [
        client.post(f"{url}/visibility", data={"visibility": "shared"}).status_code,
        client.post(f"{url}/people", data={"user_id": sam.id}).status_code,
    ]
    assert refused == [400, 400]
    assert db.session.get(Chat, a_private.id).visibility == "private"
    assert (
        client.post(f"{url}/visibility", data={"visibility": "shared", "csrf_token": token}).status_code
        == 303
    )
    assert client.post(f"{url}/people", data={"user_id": sam.id, "csrf_token": token}).status_code == 303
    db.session.expire_all()
    assert db.session.get(Chat, a_private.id).visibility == "shared"
    assert [p.user_id for p in db.session.get(Chat, a_private.id).chat_people] == [member.id, sam.id]


def test_an_open_stream_ends_when_the_chat_turns_private(app, acme, member, sam, ada, a_private):
    a_private.visibility = "shared"
    db.session.commit()
    chat_id, owner_id = a_private.id, member.id
    tab = Auth(Client(app))
    tab.login(sam)

    def owner_side():
        with app.app_context():
            wait_for(lambda: events._relay()._inboxes.get(chat_id), seconds=10, what="the stream to listen")
            chat = db.session.get(Chat, chat_id)
            chat.visibility = "private"
            posted = chat.add_message(role="user", content="now a secret", user_id=owner_id, status="done")
            db.session.commit()
            events.publish(chat_id, "new", posted.id)

    thread = threading.Thread(target=owner_side)
    thread.start()
    started = time.monotonic()
    response = tab.client.get(f"/chats/{chat_id}/stream?seconds=20")
    body = response.get_data(as_text=True)
    thread.join()

    assert response.status_code == 200 and "now a secret" not in body
    assert time.monotonic() - started < 15  # it ended at the event, not when its time was up
    assert tab.client.get(f"/chats/{chat_id}/stream?seconds=1").status_code == 404


def test_chips_and_provenance_name_only_chats_the_viewer_may_read(
    client, auth, acme, member, sam, ada, a_private
):
    shared = factories.chat(acme, [ada], "Garden club")
    chip = {"tool": "borrow_context", "state": "done", "chip": f"Borrowed 2 messages from “{TITLE}”"}
    reply = factories.message(
        shared, "From your notes.", author=ada, tools_used=[{**chip, "chat_id": a_private.id}]
    )
    db.session.add(
        ReplySources(message_id=reply.id, summary_chat_ids=[a_private.id], borrowed_chat_id=a_private.id)
    )
    db.session.commit()

    auth.login(sam)
    seen_by_b = client.get(f"/chats/{shared.id}").text
    auth.login(member)
    seen_by_a = client.get(f"/chats/{shared.id}").text

    for_b, for_a = (
        re.search(rf'<article id="message-{reply.id}".*?</article>', html, re.S).group(0)
        for html in (seen_by_b, seen_by_a)
    )
    assert TITLE not in seen_by_b and f'href="/chats/{a_private.id}"' not in seen_by_b
    assert "Borrowed messages from another conversation" in for_b
    assert "a conversation this reply drew on that you cannot open" in for_b
    assert TITLE in for_a and f'<a class="chip" href="/chats/{a_private.id}"' in for_a
    assert f'<li><a href="/chats/{a_private.id}">a conversation this reply drew on</a></li>' in for_a


def test_the_other_conversations_panel_never_lists_a_chat_the_viewer_may_not_read(
    client, auth, acme, sam, ada, a_private
):
    shared = factories.chat(acme, [ada], "Garden club")
    factories.message(shared, "hello", author=sam)
    factories.summary(shared, ada, "Planning shade beds.")
    factories.message(a_private, "again", author=a_private.chat_people[0].user)
    mine = factories.chat(acme, [ada], "Sam's own", people=[sam])
    auth.login(sam)

    panel = client.get(
        f"/chats/{mine.id}", headers={"HX-Request": "true", "HX-Target": "cross-conversations"}
    )

    assert "Planning shade beds." in panel.text and "Garden club" in panel.text
    assert TITLE not in panel.text and SECRET not in panel.text


def test_the_jobs_page_shows_that_a_private_chat_exists_not_its_title(
    client, auth, admin, acme, ada, a_private
):
    own = factories.chat(acme, [ada], "Admin's own", people=[admin])
    run = factories.job_run(acme, "summarize", target=f"chat:{a_private.id} agent:{ada.id}")
    own_run = factories.job_run(acme, "compact", target=f"chat:{own.id}")
    first = db.session.scalar(sa.select(sa.func.min(Message.id)).where(Message.chat_id == a_private.id))
    reply_run = factories.job_run(acme, "reply", target=f"messages:{first}")
    auth.login(admin)

    page = client.get("/admin/jobs").text
    row = re.search(rf'<tr id="run-{run.id}".*?</tr>', page, re.S).group(0)
    own_row = re.search(rf'<tr id="run-{own_run.id}".*?</tr>', page, re.S).group(0)

    assert "a private chat" in row and f'href="/chats/{a_private.id}"' not in row and TITLE not in page
    assert f'<a href="/chats/{own.id}">Admin&#39;s own</a>' in own_row
    assert "a private chat" in re.search(rf'<tr id="run-{reply_run.id}".*?</tr>', page, re.S).group(0)
    assert TITLE not in client.get("/admin/usage").text


def test_neighbouring_conversation_ids_look_unrelated_and_decode_exactly(app):
    ids = [public_ids.encode(i) for i in range(1, 1001)]

    def common_run(first: str, second: str) -> int:
        return SequenceMatcher(None, first, second).find_longest_match(0, len(first), 0, len(second)).size

    assert max(common_run(a, b) for a, b in zip(ids, ids[1:], strict=False)) <= 3
    assert len(set(ids)) == len(ids)
    assert [public_ids.decode(e) for e in ids] == list(range(1, 1001))
    for big in (2**31 - 1, 2**32 - 1, 2**32, 2**40):
        assert public_ids.decode(public_ids.encode(big)) == big
    assert public_ids.encode(2) != "eLlbU3Rx" and public_ids.encode(3) != "e3lbU3Rx"


def test_a_chat_is_never_found_with_owned_or_404(app):
    from webapp.web.auth import owned_or_404

    with pytest.raises(TypeError):
        owned_or_404(Chat, 1)


def test_a_member_is_told_an_admin_governs_a_chat_from_before_people(client, auth, acme, member, ada):
    older = factories.chat(acme, [ada], "From before")
    auth.login(member)

    page = client.get(f"/chats/{older.id}").text

    assert "An admin can add people to it and make it private." in page
    assert "Its people can add others" not in page


@pytest.mark.parametrize("which", ["private", "shared"])
def test_a_removed_persons_open_stream_receives_nothing_posted_after_the_removal(
    app, acme, admin, member, sam, ada, which
):
    """Issue 31, item 1: B holds the stream of a chat B is a person of (private) or of a shared chat; an admin
    removes B; what is posted afterwards never reaches B's stream, which ends at once."""
    chat = factories.chat(acme, [ada], "Ours", people=[member, sam] if which == "private" else [])
    chat_id, sam_id, admin_id, owner_id = chat.id, sam.id, admin.id, member.id
    tab = Auth(Client(app))
    tab.login(sam)

    def admin_side():
        with app.app_context():
            wait_for(lambda: events._relay()._inboxes.get(chat_id), seconds=10, what="the stream to listen")
            db.session.get(User, sam_id).remove(by=db.session.get(User, admin_id))
            db.session.commit()
            posted = db.session.get(Chat, chat_id).add_message(
                role="user", content="after the removal", user_id=owner_id, status="done"
            )
            db.session.commit()
            events.publish(chat_id, "new", posted.id)

    thread = threading.Thread(target=admin_side)
    thread.start()
    started = time.monotonic()
    body = tab.client.get(f"/chats/{chat_id}/stream?seconds=20").get_data(as_text=True)
    thread.join()

    assert "after the removal" not in body
    assert time.monotonic() - started < 5  # it ended at the message, not when its time was up


def test_a_removed_persons_silent_stream_ends_within_seconds(app, acme, admin, sam, ada):
    app.config["STREAM_KEEPALIVE_SECONDS"] = 0.5
    chat = factories.chat(acme, [ada], "Quiet")
    chat_id, sam_id, admin_id = chat.id, sam.id, admin.id
    tab = Auth(Client(app))
    tab.login(sam)

    def admin_side():
        with app.app_context():
            wait_for(lambda: events._relay()._inboxes.get(chat_id), seconds=10, what="the stream to listen")
            db.session.get(User, sam_id).remove(by=db.session.get(User, admin_id))
            db.session.commit()

    thread = threading.Thread(target=admin_side)
    thread.start()
    started = time.monotonic()
    tab.client.get(f"/chats/{chat_id}/stream?seconds=30").get_data()
    thread.join()

    assert time.monotonic() - started < 10  # a keepalive after the recheck interval, not the 30 s


def test_only_a_chats_people_rename_or_discard_it_and_others_hide_it_from_their_own_list(
    client, auth, acme, member, sam, ada
):
    """Issue 31, item 8: Ben (sam) may read Ana's (member's) shared chat but is not one of its people: he cannot
    rename or discard it for everyone, he may hide it from his own list; when Ana discards it, it says who did."""
    shared = factories.chat(acme, [ada], "Garden club", people=[member])
    shared.visibility = "shared"
    db.session.commit()
    auth.login(sam)
    page = client.get(f"/chats/{shared.id}").text
    assert "Discard this chat" not in page and "Rename" not in page and "Hide from my list" in page

    assert client.post(f"/chats/{shared.id}/rename", data={"title": "Mine now"}).status_code == 403
    assert client.post(f"/chats/{shared.id}/discard").status_code == 403
    hidden = client.post(f"/chats/{shared.id}/hide", follow_redirects=True)
    assert "Garden club" not in hidden.text.split("chat-list")[1]  # gone from Ben's list
    assert "Hidden from your list" in client.get("/chats/?discarded=1").text
    db.session.expire_all()
    assert (db.session.get(Chat, shared.id).title, db.session.get(Chat, shared.id).discarded_at) == (
        "Garden club",
        None,
    )

    client.get("/logout")
    auth.login(member)
    assert "Garden club" in client.get("/chats/").text  # Ana's list is as it was
    assert client.post(f"/chats/{shared.id}/discard").status_code == 303
    assert "Discarded by milo on" in client.get("/chats/?discarded=1").text
    assert "This chat was discarded by milo on" in client.get(f"/chats/{shared.id}").text
