"""Live updates for chat pages: reply jobs publish to a Redis channel per chat; any web process relays them
to the browsers of that chat as Server-Sent Events.

An open stream mostly waits. The stream service (gunicorn's gevent worker, see README) holds each one as a
greenlet rather than a request thread, and each user may hold at most STREAM_MAX_PER_USER of them: a slot is a
member of a Redis sorted set scored by its expiry, so a slot of a process that died frees itself.
"""

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from redis.exceptions import RedisError

from webapp.queue import redis_connection

log = logging.getLogger(__name__)


def channel(chat_id: int) -> str:
    return f"cairn:chat:{chat_id}"


def publish(chat_id: int, kind: str, message_id: int, text: str = "") -> None:
    """kind is "delta" (text streamed so far is extended by `text`) or "final" (the message changed state)."""
    payload = json.dumps({"kind": kind, "message_id": message_id, "text": text})
    redis_connection().publish(channel(chat_id), payload)


def listen(chat_id: int, max_seconds: float, keepalive: float) -> Iterator[dict[str, Any] | None]:
    """Yield each event published for the chat, and None after `keepalive` seconds of silence, until
    max_seconds. A keepalive is also how a stream notices that its browser has left: the write fails."""
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
            elif time.monotonic() - quiet_since >= keepalive:
                quiet_since = time.monotonic()
                yield None
    finally:
        pubsub.close()


SLOT_GRACE_SECONDS = 60  # a slot outlives its stream's time by this much if nobody released it


def _slots_key(user_id: int) -> str:
    return f"cairn:streams:user:{user_id}"


def take_stream_slot(user_id: int, limit: int, seconds: float) -> Callable[[], None] | None:
    """Reserve one of the user's `limit` stream slots for `seconds` (and a minute's grace); returns the
    function that gives it back, or None when all are taken."""
    connection, key = redis_connection(), _slots_key(user_id)
    slot, now = uuid.uuid4().hex, time.time()
    pipe = connection.pipeline()  # MULTI: drop expired slots, add ours, count
    pipe.zremrangebyscore(key, "-inf", now)
    pipe.zadd(key, {slot: now + seconds + SLOT_GRACE_SECONDS})
    pipe.zcard(key)
    pipe.expire(key, int(seconds + SLOT_GRACE_SECONDS) + 1)
    _, _, taken, _ = pipe.execute()

    def release() -> None:
        try:
            connection.zrem(key, slot)
        except RedisError:
            log.warning("stream slot %s of user %s not released; it expires by itself", slot, user_id)

    if taken > limit:
        release()
        return None
    return release


def open_stream_count(user_id: int) -> int:
    return redis_connection().zcount(_slots_key(user_id), time.time(), "+inf")


def sse(event: str, data: str) -> str:
    """One Server-Sent Event; multi-line data becomes several data: lines, which the browser joins with \\n."""
    lines = data.split("\n")
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"
