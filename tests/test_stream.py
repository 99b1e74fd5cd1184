"""The chat page's live stream: reply text as escaped deltas, then the rendered final message."""

import threading
import time

from tests import factories
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
        time.sleep(0.3)
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
    assert f"event: delta-{reply.id}\ndata: &lt;b&gt;Hi\n\n" in body
    assert "not for this chat" not in body
    final = body.split(f"event: final-{reply.id}\n")[1]
    assert f'id="message-{reply.id}"' in final and "<strong>Hi</strong> there" in final


def _in_context(app, func):
    with app.app_context():
        func()
