"""The chat page's live stream: reply text as escaped deltas, then the rendered final message."""

import threading

from werkzeug.test import Client

from tests import factories
from tests.conftest import Auth, wait_for
from webapp import events
from webapp.extensions import db
from webapp.models import Message


def test_sse_format_splits_lines():
    assert events.sse("delta-1", "a\nb") == "event: delta-1\ndata: a\ndata: b\n\n"


def test_the_stream_relays_deltas_escaped_and_the_final_message_rendered(app, client, auth, admin):
    auth.login(admin)
    ada = factories.agent(admin.account, "Ada")
    chat = factories.chat(admin.account, [ada])
    reply = factories.message(chat, "", author=ada, status="streaming")
    other_chat = factories.chat(admin.account, [ada])
    reply_id = reply.id

    def worker_side():
        wait_for(lambda: events._relay()._inboxes.get(chat.id), seconds=10, what="the stream to listen")
        events.publish(chat.id, "delta", reply.id, "<b>Hi")
        events.publish(other_chat.id, "delta", reply.id, "not for this chat")
        finished = db.session.get(Message, reply_id)
        finished.content, finished.status = "**Hi** there", "done"
        db.session.commit()
        events.publish(chat.id, "final", reply.id)

    with app.app_context():
        thread = threading.Thread(target=lambda: _in_context(app, worker_side))
        thread.start()
        response = client.get(f"/chats/{chat.id}/stream?seconds=1.5")
        body = response.get_data(as_text=True)
        thread.join()

    assert response.mimetype == "text/event-stream"
    assert f"event: delta-{reply.id}\ndata: <p>&lt;b&gt;Hi</p>\n" in body  # markdown, sanitized
    assert "not for this chat" not in body
    final = body.split(f"event: final-{reply.id}\n")[1]
    assert f'id="message-{reply.id}"' in final and "<strong>Hi</strong> there" in final


def _in_context(app, func):
    with app.app_context():
        func()


def test_each_user_holds_a_limited_number_of_streams_and_leaving_frees_one(app, signed_in):
    app.config["STREAM_MAX_PER_USER"] = 2
    chat = factories.chat(signed_in.account, [factories.agent(signed_in.account, "Ada")])
    url = f"/chats/{chat.id}/stream?seconds=5"
    # A tab each, signed in as one user; werkzeug's plain client, as Flask's keeps one request context open.
    tabs = [Auth(Client(app)) for _ in range(3)]
    for tab in tabs:
        tab.login(signed_in)
    first, second = (tab.client.get(url, buffered=False) for tab in tabs[:2])

    third = tabs[2].client.get(url, buffered=False)

    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
    assert "Too many open live streams" in third.text
    assert events.open_stream_count(signed_in.id) == 2
    # The tab left: the server closes the response (with a real server: test_stream_service). Closed in
    # reverse order, as each open generator here holds a Flask context in this one thread.
    second.close()
    assert events.open_stream_count(signed_in.id) == 1
    fourth = tabs[2].client.get(url, buffered=False)
    assert fourth.status_code == 200
    for response in (fourth, first):
        response.close()
    assert events.open_stream_count(signed_in.id) == 0


def test_a_stream_of_another_accounts_chat_is_a_404(client, signed_in, stranger):
    theirs = factories.chat(stranger.account, [factories.agent(stranger.account, "Eve's agent")])
    assert client.get(f"/chats/{theirs.id}/stream?seconds=1").status_code == 404
    assert events.open_stream_count(signed_in.id) == 0
