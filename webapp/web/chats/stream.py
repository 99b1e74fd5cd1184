"""Live updates of a chat page: Server-Sent Events of reply text as it streams and each finished message, until
the person may no longer read the chat."""

import time

from flask import Response, current_app, render_template, request, stream_with_context
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required

from webapp import events
from webapp.extensions import db
from webapp.models import Chat, Message, access
from webapp.web.auth import readable_chat_or_404
from webapp.web.chats.common import STUCK_AFTER, bp
from webapp.web.chats.page import forget_which_chats_readable
from webapp.web.markdown import render_markdown

STREAM_SECONDS = 300  # browsers reconnect after this, so no connection lives forever


STREAM_RECHECK_SECONDS = 5  # an open stream asks again whether its person may still read the chat


@bp.get("/<int:chat_id>/stream")
@login_required
def stream(chat_id: int) -> ResponseReturnValue:
    """Server-Sent Events for this chat: reply text as it streams, then each finished message. The stream ends
    once its person may no longer read the chat (made private, or they were taken out of it); the browser's
    reconnection is then a 404."""
    chat = readable_chat_or_404(chat_id)
    seconds = max(1.0, min(request.args.get("seconds", STREAM_SECONDS, type=float), STREAM_SECONDS))
    keepalive = current_app.config["STREAM_KEEPALIVE_SECONDS"]
    release_slot = events.take_stream_slot(
        current_user.id, current_app.config["STREAM_MAX_PER_USER"], seconds
    )
    if release_slot is None:
        return Response("Too many open live streams; close another tab of Cairn.", status=429)
    db.session.close()  # hold no database connection while waiting for events

    def generate():
        yield ": connected\n\n"
        streamed: dict[int, str] = {}  # each reply's text since its last "final" event
        checked_at = time.monotonic()
        for event in events.listen(chat.id, seconds, keepalive):
            # Asked before each message is sent, and every few seconds of streamed text or of silence (at each
            # keepalive), so a stream ends within seconds once its person may no longer read the chat.
            if (
                event is not None and event["kind"] != "delta"
            ) or time.monotonic() - checked_at > STREAM_RECHECK_SECONDS:
                if not _still_readable(chat):
                    return
                checked_at = time.monotonic()
            if event is None:
                yield ": keepalive\n\n"
            elif event["kind"] == "delta":
                text = streamed.get(event["message_id"], "") + event["text"]
                streamed[event["message_id"]] = text
                yield events.sse(f"delta-{event['message_id']}", str(render_markdown(text)))
            elif event["kind"] == "new":
                yield events.sse("message", _render_final(chat, event["message_id"]))
            else:
                streamed.pop(event["message_id"], None)
                yield events.sse(f"final-{event['message_id']}", _render_final(chat, event["message_id"]))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    response = Response(stream_with_context(generate()), mimetype="text/event-stream", headers=headers)
    # Closed when the time is up or the browser has left (the server's next write fails): free the slot.
    response.call_on_close(release_slot)
    return response


def _still_readable(chat: Chat) -> bool:
    readable = bool(access.readable_among(current_user, [chat.id]))
    db.session.close()  # hold no database connection while waiting for the next event
    return readable


def _render_final(chat: Chat, message_id: int) -> str:
    forget_which_chats_readable()  # which chats the viewer may read may have changed since the last event
    found = db.session.get(Message, message_id)  # a fresh transaction: sees what the worker just committed
    if found is None or found.chat_id != chat.id:
        db.session.close()
        return ""
    html = render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)
    db.session.close()  # hold no database connection while waiting for the next event
    return html
