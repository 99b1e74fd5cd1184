"""A reply as an API client receives it. The reply job (webapp.jobs.replies) writes it on a worker and publishes
its text as it streams (webapp.events); the request, subscribed to the chat's events before the reply was asked
for, relays that text as `chat.completion.chunk` events, or waits for the finished reply and answers once.

While it waits it holds no database connection (as the chat page's stream), and looks at the stored reply after
each of its events and after every keepalive interval of silence, so a lost event only delays it.
"""

import json
import queue
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from flask import Response, current_app

from webapp.api.errors import ApiError
from webapp.extensions import db
from webapp.models import Message, access


@dataclass
class Stored:
    """The reply as the database holds it."""

    # pending, streaming, done, failed; "gone" when the reply was deleted (edited away in Cairn); "revoked" when
    # its person may no longer read the chat (removed from the account, or taken out of a private chat)
    status: str
    content: str = ""
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    timed_out: bool = False

    @property
    def final(self) -> bool:
        """Nothing more will come of following it: finished, failed, deleted, or waited for long enough."""
        return self.timed_out or self.status in ("done", "failed", "gone", "revoked")

    @property
    def restarting(self) -> bool:
        """It failed and waits for a retry, which writes it again from the start."""
        return self.status == "pending" and bool(self.error)


def _stored(reply_id: int) -> Stored:
    db.session.close()  # a fresh transaction: what the worker has committed
    reply = db.session.get(Message, reply_id)
    if reply is None:
        return Stored("gone", error="The reply was deleted in Cairn.")
    stored = Stored(
        reply.status, reply.content, reply.error, reply.input_tokens or 0, reply.output_tokens or 0
    )
    db.session.close()  # hold no database connection while waiting
    return stored


def _allowed(reader: tuple[int, int], chat_id: int) -> bool:
    allowed = access.may_read(*reader, chat_id)
    db.session.close()  # hold no database connection while waiting
    return allowed


def _revoked() -> Stored:
    return Stored("revoked", error="You may no longer read this conversation.")


def follow(
    inbox: queue.Queue, reply_id: int, seconds: float, reader: tuple[int, int], chat_id: int
) -> Iterator[str | Stored | None]:
    """The reply's text as it streams (str), None after each keepalive interval of silence, the stored reply
    when it fails and will be written again, and last the finished reply (or, after `seconds`, the unfinished
    one, timed_out). Before anything but text, and at each keepalive, it asks whether the person (`reader`: their
    id and account's) may still read the chat: if not, it ends with a revoked reply (within a keepalive interval
    of a removal)."""
    keepalive = current_app.config["STREAM_KEEPALIVE_SECONDS"]
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = inbox.get(timeout=min(keepalive, left))
        except queue.Empty:
            event = None
        if event is not None and event["message_id"] != reply_id:
            continue  # another message of the chat
        if event is not None and event["kind"] == "delta":
            yield event["text"]
            continue
        if not _allowed(reader, chat_id):
            yield _revoked()
            return
        stored = _stored(reply_id)
        if stored.final or stored.restarting:
            yield stored
        if stored.final:
            return
        if event is None:
            yield None
    stored = _stored(reply_id) if _allowed(reader, chat_id) else _revoked()
    stored.timed_out = stored.status not in ("done", "failed", "gone", "revoked")
    yield stored


def refusal(name: str, stored: Stored, seconds: float) -> ApiError:
    """Why the reply did not come: its person may no longer read the chat (403), it failed (502), no worker took
    it (503), or it took too long (504)."""
    if stored.status == "revoked":
        return ApiError(403, f"{stored.error}", kind="permission_error", code="access_revoked")
    if stored.status in ("failed", "gone"):
        return ApiError(
            502, f"{name} could not answer: {stored.error}", kind="server_error", code="reply_failed"
        )
    later = "The reply still arrives in the chat in Cairn."
    if stored.status == "pending" and not stored.error:
        return ApiError(
            503,
            f"No worker took the reply within {seconds:g} seconds: is a Cairn worker running? {later}",
            kind="server_error",
            code="no_worker",
        )
    return ApiError(
        504, f"{name} did not finish within {seconds:g} seconds. {later}", kind="server_error", code="timeout"
    )


@dataclass
class Completion:
    """What the client is told, in the shapes of OpenAI's chat completions."""

    model: str
    id: str = ""
    created: int = 0

    def __post_init__(self) -> None:
        self.id = self.id or f"chatcmpl-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())

    def whole(self, stored: Stored) -> dict:
        message = {"role": "assistant", "content": stored.content}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        return {**self._head("chat.completion"), "choices": [choice], "usage": _usage(stored)}

    def chunk(self, delta: dict, finish_reason: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return _event({**self._head("chat.completion.chunk"), "choices": [choice]})

    def usage_chunk(self, stored: Stored) -> str:
        return _event({**self._head("chat.completion.chunk"), "choices": [], "usage": _usage(stored)})

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def _usage(stored: Stored) -> dict:
    prompt, completion = stored.input_tokens, stored.output_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def waited(
    completion: Completion, name: str, events: Iterator[str | Stored | None], seconds: float
) -> Response:
    """The finished reply as one chat.completion, or the error saying why it did not come."""
    final = next(item for item in events if isinstance(item, Stored) and item.final)  # follow ends with one
    if final.status == "done":
        return Response(json.dumps(completion.whole(final)), mimetype="application/json")
    raise refusal(name, final, seconds)


def streamed(
    completion: Completion,
    name: str,
    events: Iterator[str | Stored | None],
    seconds: float,
    include_usage: bool,
) -> Iterator[str]:
    """The reply as server-sent chunks as it is written, then a chunk with its finish_reason (and its usage, if
    asked) and `data: [DONE]`; or an error event when it fails, restarts after text was sent, or takes too long."""
    yield completion.chunk({"role": "assistant", "content": ""})
    sent = ""
    for item in events:
        if item is None:
            yield ": keepalive\n\n"
        elif isinstance(item, str):
            sent += item
            yield completion.chunk({"content": item})
        elif item.status == "done":
            if rest := _remainder(sent, item.content):
                yield completion.chunk({"content": rest})
            yield completion.chunk({}, finish_reason="stop")
            if include_usage:
                yield completion.usage_chunk(item)
            yield "data: [DONE]\n\n"
            return
        elif item.final or sent:  # failed, too slow, or restarting after its text was sent
            yield _event((refusal(name, item, seconds) if item.final else _restarted(name)).payload())
            return
        # else it restarts before any text was sent: the retry's text is the answer


def _restarted(name: str) -> ApiError:
    return ApiError(
        502,
        f"{name}'s model failed mid-answer; Cairn writes the reply again in the chat. Ask again to get it.",
        kind="server_error",
        code="reply_restarted",
    )


def _remainder(sent: str, content: str) -> str:
    """What of the finished reply the stream has not sent: text held back between events, or all of it when the
    stream missed nothing but saw no text (a reply whose events were lost)."""
    if content.startswith(sent):
        return content[len(sent) :]
    head = sent.lstrip()  # the stored reply is stripped
    return content[len(head) :] if content.startswith(head) else ""
