"""Live updates for chat pages: reply jobs publish to a Redis channel per chat; any web process relays them
to the browsers of that chat as Server-Sent Events."""

import json
import time
from collections.abc import Iterator
from typing import Any

from webapp.queue import redis_connection

KEEPALIVE_SECONDS = 15


def channel(chat_id: int) -> str:
    return f"cairn:chat:{chat_id}"


def publish(chat_id: int, kind: str, message_id: int, text: str = "") -> None:
    """kind is "delta" (text streamed so far is extended by `text`) or "final" (the message changed state)."""
    payload = json.dumps({"kind": kind, "message_id": message_id, "text": text})
    redis_connection().publish(channel(chat_id), payload)


def listen(chat_id: int, max_seconds: float) -> Iterator[dict[str, Any] | None]:
    """Yield each event published for the chat, and None every KEEPALIVE_SECONDS of silence, until max_seconds."""
    pubsub = redis_connection().pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel(chat_id))
    deadline = time.monotonic() + max_seconds
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            message = pubsub.get_message(timeout=1.0)
            if message is not None:
                quiet_since = time.monotonic()
                yield json.loads(message["data"])
            elif time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                quiet_since = time.monotonic()
                yield None
    finally:
        pubsub.close()


def sse(event: str, data: str) -> str:
    """One Server-Sent Event; multi-line data becomes several data: lines, which the browser joins with \\n."""
    lines = data.split("\n")
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"
