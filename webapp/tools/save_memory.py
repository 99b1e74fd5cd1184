from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Agent, AgentMemory, Chat, Message
from webapp.models.access import memories_heard_in
from webapp.models.audit import record_change
from webapp.models.memories import (
    JOURNAL_WINDOW,
    MAX_CONTENT_CHARS,
    active_memories,
    add_sources,
    content_hash_of,
    normalized,
)
from webapp.timeutil import utcnow
from webapp.tools.base import Tool, ToolContext, cut

DESCRIPTION = (
    "Save something to your own long-term memory. Use 'journal' for facts, commitments and context worth "
    "keeping for now (journal entries fade after 7 days); use 'core' for lasting beliefs, relationships and "
    "lessons (permanent). Save one clear, self-contained statement per call."
)


def save_memory(context: ToolContext, content: str, memory_type: str) -> dict[str, Any]:
    """Save a memory for the agent that called the tool, heard by whoever may read this chat, and say when it
    will fade."""
    content = content.strip()
    if not content:
        return {"error": "content must not be empty."}
    # Provenance: the reply whose tool call saved it.
    memory, saved = remember(
        context.agent,
        context.chat,
        content,
        memory_type,
        via="save_memory",
        sources=led_to(context, content),
        message_id=context.message.id,
    )
    if not saved:  # e.g. a retried reply running the same call again
        return {"saved": False, "memory_id": memory.id, "note": "You already remember exactly this."}
    return {
        "saved": True,
        "memory_id": memory.id,
        "memory_type": memory_type,
        "note": fading_note(memory_type),
    }


def remember(
    agent: Agent,
    chat: Chat,
    content: str,
    memory_type: str,
    *,
    via: str,
    user_id: int | None = None,
    sources: Sequence[int] = (),
    **provenance: Any,
) -> tuple[AgentMemory, bool]:
    """Save a memory of the agent from `chat` (heard by whoever may read that chat), with its audit row (`via`,
    the person if one acted, and the provenance given), committed; or the identical active memory already heard
    there; `sources` are the ids of the messages it came from. Returns the memory and whether it is new.
    (save_memory and the MCP server's save_memory call this.)"""
    # Only a memory heard here counts as already known: one heard elsewhere would stay unheard in this chat.
    existing = db.session.scalar(
        active_memories(agent.id)
        .where(AgentMemory.content_hash == content_hash_of(content), memories_heard_in(chat))
        .limit(1)
    )
    if existing is not None:
        return existing, False
    memory = AgentMemory(
        agent=agent,
        content=content,
        memory_type=memory_type,
        chat_id=chat.id,
        audience="chat",  # whoever may read this chat, now and later (webapp.models.access)
    )
    db.session.add(memory)
    add_sources(memory, sources)
    record_change(memory, "memory_create", None, via=via, user_id=user_id, chat_id=chat.id, **provenance)
    db.session.commit()
    return memory, True


def led_to(context: ToolContext, content: str) -> list[int]:
    """The messages a memory saved in this reply came from: the person's latest message before it, and the
    agent's reply (this one so far, or its last before that message) when the memory quotes it."""
    earlier = sa.select(Message).where(
        Message.chat_id == context.chat.id, Message.id < context.message.id, Message.status == "done"
    )
    person = db.session.scalar(earlier.where(Message.role == "user").order_by(Message.id.desc()).limit(1))
    if person is None:
        return []
    replies = [context.message]
    replies += db.session.scalars(
        earlier.where(
            Message.agent_id == context.agent.id, Message.role == "assistant", Message.id < person.id
        )
        .order_by(Message.id.desc())
        .limit(1)
    )
    quoted = [r.id for r in replies if _quotes(content, r.content or "")]
    return sorted([person.id, *quoted])


QUOTED_WORDS = (
    5  # a memory quotes a reply when this many words in a row (or all of a shorter memory) are in it
)


def _quotes(content: str, reply: str) -> bool:
    words, said = normalized(content).split(), f" {normalized(reply)} "
    runs = [words[i : i + QUOTED_WORDS] for i in range(max(1, len(words) - QUOTED_WORDS + 1))]
    return any(run and f" {' '.join(run)} " in said for run in runs)


def fading_note(memory_type: str, whose: str = "your") -> str:
    """When a memory just saved fades: a journal entry after 7 days, a core memory never."""
    if memory_type == "journal":
        fades = (utcnow() + JOURNAL_WINDOW).strftime("%Y-%m-%d")
        return f"Saved to {whose} journal. It will fade after 7 days, on {fades}."
    return f"Saved to {whose} core memory. Core memories are permanent."


def _chip(arguments: dict[str, Any], result: dict[str, Any], _chat: Chat) -> dict[str, Any]:
    core = arguments.get("memory_type") == "core"
    verb = "Saved to" if result.get("saved") else "Already in"
    return {
        "chip": f"{verb} {'core memory' if core else 'journal'}: “{cut(str(arguments.get('content', '')))}”",
        "memory_id": result.get("memory_id"),
        "memory_type": "core" if core else "journal",
    }


TOOL = Tool(
    name="save_memory",
    remembers=True,
    description=DESCRIPTION,
    parameters={
        "type": "object",
        "properties": {
            "content": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_CONTENT_CHARS,
                "description": "The memory, in your own words.",
            },
            "memory_type": {"type": "string", "enum": ["journal", "core"], "description": "journal or core"},
        },
        "required": ["content", "memory_type"],
        "additionalProperties": False,
    },
    run=save_memory,
    label=lambda _arguments, _chat: "Saving a memory…",
    chip=_chip,
    failure="save a memory",
)
