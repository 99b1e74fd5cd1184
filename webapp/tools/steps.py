"""How a tool call shows in the chat: a step while it runs ("Saving a memory…"), then a chip saying what it did,
linked to the memory saved or the conversation borrowed from. Stored on the reply as plain JSON.

A step or chip names (and links) another conversation only when it may be heard in the chat it shows in
(webapp.models.access.chats_heard_in): whatever id the model wrote, no one there learns another chat's title."""

from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Chat, public_ids
from webapp.models.access import chats_heard_in

CHIP_CHARS = 80
UNNAMED_LABEL = "Reading another conversation…"
UNNAMED_CHIP = "Borrowed messages from another conversation"


def running(name: str, arguments: dict[str, Any], chat: Chat) -> dict[str, Any]:
    """The step shown in `chat` while the tool runs."""
    if name == "save_memory":
        label = "Saving a memory…"
    elif name == "borrow_context":
        source = _chat_named(arguments.get("conversation_id"), chat)
        label = f"Reading “{source.display_title}”…" if source else UNNAMED_LABEL
    elif name == "recall":
        label = f"Searching its memory for “{_cut(str(arguments.get('query', '')))}”…"
    else:
        label = f"Using {name.replace('_', ' ')}…"
    return {"tool": name, "state": "running", "label": label}


def finished(name: str, arguments: dict[str, Any], result: dict[str, Any], chat: Chat) -> dict[str, Any]:
    """The chip shown in `chat` once the tool returned `result`."""
    if "error" in result:
        verb = {"save_memory": "save a memory", "borrow_context": "read that conversation"}.get(name, name)
        return {"tool": name, "state": "failed", "chip": f"Could not {verb}: {_cut(result['error'])}"}
    if name == "save_memory":
        where = "core memory" if arguments.get("memory_type") == "core" else "journal"
        content = _cut(str(arguments.get("content", "")))
        verb = "Saved to" if result.get("saved") else "Already in"
        return {
            "tool": name,
            "state": "done",
            "chip": f"{verb} {where}: “{content}”",
            "memory_id": result.get("memory_id"),
            "memory_type": "core" if where == "core memory" else "journal",
        }
    if name == "borrow_context":
        source = _chat_named(arguments.get("conversation_id"), chat)
        count = result.get("message_count", 0)
        title = source.display_title if source else "another conversation"
        chip = f"Borrowed {count} message{'' if count == 1 else 's'} from “{title}”"
        return {"tool": name, "state": "done", "chip": chip, "chat_id": source.id if source else None}
    if name == "recall":
        found = len(result.get("results", []))
        chip = (
            f"Found {found} thing{'' if found == 1 else 's'} in its memory"
            if found
            else "Found nothing in its memory"
        )
        return {"tool": name, "state": "done", "chip": chip}
    return {"tool": name, "state": "done", "chip": f"Used {name.replace('_', ' ')}"}


def may_name_a_chat(step: dict[str, Any]) -> bool:
    """Whether the step's text may hold another conversation's title: a borrow_context step that did not fail."""
    return step.get("tool") == "borrow_context" and step.get("state") != "failed"


def unnamed(step: dict[str, Any]) -> dict[str, Any]:
    """The step as someone who may not read the conversation it names sees it: without that conversation's
    title (a running step has no chat_id to ask about, so it is said this way to whoever may not ask)."""
    if step.get("state") == "running":
        return {**step, "label": UNNAMED_LABEL}
    return {**step, "chip": UNNAMED_CHIP}


def _chat_named(conversation_id: Any, shown_in: Chat) -> Chat | None:
    """The chat behind the id, if it may be heard where the step shows; else None (named as "another")."""
    chat_id = public_ids.decode(str(conversation_id or "").strip().strip("[]\"'"))
    if chat_id is None:
        return None
    return db.session.scalar(sa.select(Chat).where(Chat.id == chat_id, chats_heard_in(shown_in)))


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= CHIP_CHARS else text[: CHIP_CHARS - 1].rstrip() + "…"
