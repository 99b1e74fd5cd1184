"""Opaque conversation ids for agents: reversible, never the database id, and different per deployment.

The Sqids alphabet is shuffled deterministically from SECRET_KEY, so an id seen in one deployment says nothing
about another, and neighbouring chats do not get guessably neighbouring ids.
"""

import hashlib
import random
from functools import lru_cache

from flask import current_app
from sqids import Sqids
from sqids.constants import DEFAULT_ALPHABET

MIN_LENGTH = 8


@lru_cache(maxsize=4)
def _codec(secret_key: str) -> Sqids:
    alphabet = list(DEFAULT_ALPHABET)
    random.Random(hashlib.sha256(f"cairn-chat-ids:{secret_key}".encode()).digest()).shuffle(alphabet)
    return Sqids(alphabet="".join(alphabet), min_length=MIN_LENGTH)


def encode(chat_id: int) -> str:
    """The opaque id of a chat."""
    return _codec(current_app.config["SECRET_KEY"]).encode([chat_id])


def decode(public_id: str) -> int | None:
    """The chat id behind an opaque id, or None for anything that is not exactly an id this app made."""
    public_id = (public_id or "").strip()
    codec = _codec(current_app.config["SECRET_KEY"])
    numbers = codec.decode(public_id) if public_id.isascii() and public_id.isalnum() else []
    if len(numbers) != 1 or codec.encode(numbers) != public_id:
        return None  # one number, in its canonical spelling only
    return numbers[0]
