from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Agent, Chat, Message, public_ids
from webapp.models.access import chats_heard_in


@dataclass
class ToolContext:
    """What a reply's tool may act on: the agent whose reply is running, in this chat, for this message."""

    agent: Agent
    chat: Chat
    message: Message


@dataclass(frozen=True)
class Tool:
    name: str
    description: str  # written for the model
    parameters: dict[str, Any]  # JSON schema of the arguments, checked before run is called
    run: Callable[..., dict[str, Any]]  # run(context, **arguments) -> JSON-able result
    in_replies: bool = True  # an agent may enable it for its replies (else only its own job offers it)
    # How a call shows in the chat (webapp.tools.steps): the step while it runs, label(arguments, chat); the chip
    # once done, chip(arguments, result, chat) -> {"chip": text, and what it links to}; what failed, in words.
    label: Callable[[dict[str, Any], Chat], str] | None = None
    chip: Callable[[dict[str, Any], dict[str, Any], Chat], dict[str, Any]] | None = None
    failure: str | None = None  # "save a memory": "Could not save a memory: …"
    names_a_chat: bool = False  # its step may name another conversation (shown only to who may read it)
    remembers: bool = False  # it keeps something of the chat (save_memory): not offered in a temporary chat

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


CHIP_CHARS = 80


def cut(text: str) -> str:
    """Text for a step or a chip: on one line, at most CHIP_CHARS."""
    text = " ".join(text.split())
    return text if len(text) <= CHIP_CHARS else text[: CHIP_CHARS - 1].rstrip() + "…"


def chat_named(conversation_id: Any, shown_in: Chat) -> Chat | None:
    """The chat behind a conversation id the model wrote, if it may be heard where the step shows; else None (it
    is then named "another conversation"): whatever id the model wrote, no one there learns another chat's title."""
    chat_id = public_ids.decode(str(conversation_id or "").strip().strip("[]\"'"))
    if chat_id is None:
        return None
    return db.session.scalar(sa.select(Chat).where(Chat.id == chat_id, chats_heard_in(shown_in)))
