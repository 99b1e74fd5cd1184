"""Live updates for chat pages: reply jobs publish to a Redis channel per chat; any web process relays them
to the browsers of that chat as Server-Sent Events.

An open stream mostly waits. The stream service (gunicorn's gevent worker, see README) holds each one as a
greenlet rather than a request thread, and each user may hold at most STREAM_MAX_PER_USER of them: a slot is a
member of a Redis sorted set scored by its expiry, so a slot of a process that died frees itself.
"""

import contextlib
import json
import logging
import os
import queue
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from redis import BlockingConnectionPool, Redis
from redis.exceptions import RedisError

from webapp.jobs.queue import redis_connection

log = logging.getLogger(__name__)


def channel(chat_id: int) -> str:
    return f"cairn:chat:{chat_id}"


def publish(chat_id: int, kind: str, message_id: int, text: str = "") -> None:
    """kind is "delta" (text streamed so far is extended by `text`) or "final" (the message changed state)."""
    payload = json.dumps({"kind": kind, "message_id": message_id, "text": text})
    try:
        redis_connection().publish(channel(chat_id), payload)
    except (
        RedisError
    ) as error:  # live updates are a courtesy: the database holds the message, a reload shows it
        log.warning("live event for chat %s not sent: %s", chat_id, error)


def listen(chat_id: int, max_seconds: float, keepalive: float) -> Iterator[dict[str, Any] | None]:
    """Yield each event published for the chat, and None after `keepalive` seconds of silence, until
    max_seconds. A keepalive is also how a stream notices that its browser has left: the write fails."""
    with subscribed(chat_id) as inbox:
        deadline = time.monotonic() + max_seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                yield inbox.get(timeout=min(keepalive, left))
            except queue.Empty:
                if deadline - time.monotonic() > 0:
                    yield None


@contextlib.contextmanager
def subscribed(chat_id: int) -> Iterator[queue.Queue]:
    """The chat's events from now on, in a queue: subscribe before posting what a reply is asked for, and
    none of its events is missed (an API client waiting for the reply)."""
    relay = _relay()  # left without the app's context too (a response closed by the server)
    inbox = relay.join(chat_id)
    try:
        yield inbox
    finally:
        relay.leave(chat_id, inbox)


class _Relay:
    """One Redis subscription per process, shared by all of its open streams: a thread (a greenlet under
    gevent) receives every chat's events and puts each into the inboxes of that chat's streams. Streams cost
    no Redis connection of their own, so their number is not bound by the connection pool."""

    def __init__(self, connection: Redis):
        self._connection = connection
        # Streams open and close in bursts (hundreds at once under gevent): their slot commands wait for a
        # connection of this small blocking pool rather than fail when the app's pool is exhausted.
        pool = connection.connection_pool
        self.slots = Redis(
            connection_pool=BlockingConnectionPool(
                connection_class=pool.connection_class,
                max_connections=20,
                timeout=10,
                **pool.connection_kwargs,
            )
        )
        self._inboxes: dict[int, set[queue.Queue]] = defaultdict(set)
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        threading.Thread(target=self._run, name="cairn-events", daemon=True).start()

    def join(self, chat_id: int) -> queue.Queue:
        inbox: queue.Queue = queue.Queue()
        with self._lock:
            self._inboxes[chat_id].add(inbox)
        self._subscribed.wait(5)  # the first stream of a process waits for the subscription
        return inbox

    def leave(self, chat_id: int, inbox: queue.Queue) -> None:
        with self._lock:
            self._inboxes[chat_id].discard(inbox)
            if not self._inboxes[chat_id]:
                del self._inboxes[chat_id]

    def _run(self) -> None:
        failures = 0
        while True:
            try:
                pubsub = self._connection.pubsub(ignore_subscribe_messages=True)
                pubsub.psubscribe(channel("*"))
                self._subscribed.set()
                failures = 0
                for message in pubsub.listen():
                    self._deliver(int(message["channel"].rsplit(b":", 1)[1]), json.loads(message["data"]))
            except RedisError as error:  # Redis restarting: streams wait; pages poll for finished replies
                if self._close_if_idle():
                    return
                failures += 1
                if failures == 1:
                    log.warning("live events paused until Redis answers: %s", error)
                time.sleep(1)

    def _close_if_idle(self) -> bool:
        """With no stream open, stop; the next stream starts a new relay."""
        with _relays_lock, self._lock:
            if self._inboxes:
                return False
            for key, relay in list(_relays.items()):
                if relay is self:
                    del _relays[key]
            return True

    def _deliver(self, chat_id: int, event: dict[str, Any]) -> None:
        with self._lock:
            inboxes = list(self._inboxes.get(chat_id, ()))
        for inbox in inboxes:
            inbox.put(event)


_relays: dict[tuple[int, int], _Relay] = {}  # (process, connection): a forked process starts its own
_relays_lock = threading.Lock()


def _relay() -> _Relay:
    connection = redis_connection()
    key = (os.getpid(), id(connection))
    with _relays_lock:
        if key not in _relays:
            _relays[key] = _Relay(connection)
        return _relays[key]


SLOT_GRACE_SECONDS = 60  # a slot outlives its stream's time by this much if nobody released it


def _slots_key(user_id: int) -> str:
    return f"cairn:streams:user:{user_id}"


def take_stream_slot(user_id: int, limit: int, seconds: float) -> Callable[[], None] | None:
    """Reserve one of the user's `limit` stream slots for `seconds` (and a minute's grace); returns the
    function that gives it back, or None when all are taken."""
    connection, key = _relay().slots, _slots_key(user_id)
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
    return _relay().slots.zcount(_slots_key(user_id), time.time(), "+inf")


def sse(event: str, data: str) -> str:
    """One Server-Sent Event; multi-line data becomes several data: lines, which the browser joins with \\n."""
    lines = data.split("\n")
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"
