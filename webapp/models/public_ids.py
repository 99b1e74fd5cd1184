"""Opaque conversation ids for agents: reversible, never the database id, and different per deployment.

An id is scrambled first by a keyed permutation (a small Feistel network keyed from SECRET_KEY), then spelled by
Sqids with an alphabet shuffled from SECRET_KEY. So neighbouring chats get unrelated-looking ids (without the
scramble Sqids spells 2 and 3 as `eLlbU3Rx` and `e3lbU3Rx`), an id seen in one deployment says nothing about
another, and decoding stays exact. They are not secrets: nothing may rely on one being unguessable (every route
and tool applies the access rule to the chat behind an id).
"""

import hashlib
import hmac
import random
from functools import lru_cache

from flask import current_app
from sqids import Sqids
from sqids.constants import DEFAULT_ALPHABET

MIN_LENGTH = 8
HALF_BITS = 16  # the permutation scrambles ids below 2**32 (every database id); larger ones pass unchanged
HALF_MASK = (1 << HALF_BITS) - 1
ROUNDS = 4


@lru_cache(maxsize=4)
def _codec(secret_key: str) -> Sqids:
    alphabet = list(DEFAULT_ALPHABET)
    random.Random(hashlib.sha256(f"cairn-chat-ids:{secret_key}".encode()).digest()).shuffle(alphabet)
    return Sqids(alphabet="".join(alphabet), min_length=MIN_LENGTH)


@lru_cache(maxsize=4)
def _round_keys(secret_key: str) -> tuple[bytes, ...]:
    return tuple(
        hmac.new(secret_key.encode(), f"cairn-chat-ids-round:{i}".encode(), hashlib.sha256).digest()
        for i in range(ROUNDS)
    )


def _round(key: bytes, half: int) -> int:
    digest = hashlib.blake2s(half.to_bytes(2, "big"), key=key, digest_size=2).digest()
    return int.from_bytes(digest, "big")


def scramble(number: int, secret_key: str) -> int:
    """A keyed permutation of the non-negative integers that moves only those below 2**32."""
    if number >> (2 * HALF_BITS):
        return number
    left, right = number >> HALF_BITS, number & HALF_MASK
    for key in _round_keys(secret_key):
        left, right = right, left ^ _round(key, right)
    return (left << HALF_BITS) | right


def unscramble(number: int, secret_key: str) -> int:
    """The inverse of scramble."""
    if number >> (2 * HALF_BITS):
        return number
    left, right = number >> HALF_BITS, number & HALF_MASK
    for key in reversed(_round_keys(secret_key)):
        left, right = right ^ _round(key, left), left
    return (left << HALF_BITS) | right


def encode(chat_id: int) -> str:
    """The opaque id of a chat."""
    return _encoded(chat_id, current_app.config["SECRET_KEY"])


@lru_cache(maxsize=4096)
def _encoded(chat_id: int, secret_key: str) -> str:
    """Kept: spelling one takes 0.1 ms, and a recall spells ten (bench.recall)."""
    return _codec(secret_key).encode([scramble(chat_id, secret_key)])


def decode(public_id: str) -> int | None:
    """The chat id behind an opaque id, or None for anything that is not exactly an id this app made."""
    public_id = (public_id or "").strip()
    secret_key = current_app.config["SECRET_KEY"]
    codec = _codec(secret_key)
    numbers = codec.decode(public_id) if public_id.isascii() and public_id.isalnum() else []
    if len(numbers) != 1 or codec.encode(numbers) != public_id:
        return None  # one number, in its canonical spelling only
    return unscramble(numbers[0], secret_key)
