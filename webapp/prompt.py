"""Prompt assembly: the one function that builds the messages for an agent's activation (DESIGN.md section 4).

Stable text first so providers can cache the prefix: the agent's system prompt, the chat's summary of its
compacted history, then the transcript after the cut, then the volatile context (memory, other conversations,
borrowed context, time, participants) at the end.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from flask import current_app
from sqlalchemy.orm import joinedload

from webapp.extensions import db
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, Message, User
from webapp.models.memories import prompt_memories
from webapp.prompts import render
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

TRUNCATION_NOTE = "(Earlier messages of this conversation are not shown; only the most recent ones fit.)"


@dataclass
class Prompt:
    messages: list[dict[str, Any]]
    # The staged borrowed context this prompt included; the reply clears exactly this once it succeeds.
    borrowed_context: dict[str, Any] | None = None


def build_messages(chat: Chat, agent: Agent, *, before_message_id: int | None = None) -> list[dict[str, Any]]:
    """The OpenAI messages for `agent` answering in `chat`, seeing the finished messages before the given id."""
    return build_prompt(chat, agent, before_message_id=before_message_id).messages


def build_prompt(chat: Chat, agent: Agent, *, before_message_id: int | None = None) -> Prompt:
    """The messages for an activation, and the borrowed context they include."""
    now = utcnow()
    transcript, truncated = _transcript(chat, agent, before_message_id)
    borrowed = _staged_borrowed_context(chat, agent)
    borrowed_section = _borrowed_section(borrowed)
    context = [
        _memory_section(agent, now),
        _other_conversations_section(chat, agent),
        borrowed_section,
        _now_section(chat, agent, now),
    ]
    if truncated:
        context.insert(0, TRUNCATION_NOTE)
    messages = [
        {"role": "system", "content": agent.identity()},
        *_conversation_so_far(chat),
        *transcript,
        {"role": "system", "content": "\n\n".join(part for part in context if part)},
    ]
    return Prompt(messages, borrowed if borrowed_section else None)


def _conversation_so_far(chat: Chat) -> list[dict[str, str]]:
    """Spec 004: the summary of the history before the cut; it changes only when a compaction runs.

    The summary grows by a section per compaction, so only its newest sections within a token budget go in.
    """
    doc = chat.memory_doc.strip()
    if not doc:
        return []
    sections = doc.split("\n\n## ")
    budget, kept, used = current_app.config["MEMORY_DOC_PROMPT_TOKENS"], [], 0
    for section in reversed(sections):
        used += count_tokens(section)
        if used > budget and kept:
            break
        kept.append(section)
    text = "\n\n## ".join(reversed(kept))
    if len(kept) < len(sections):
        text = f"(Older parts of this summary are left out.)\n\n## {text}"
    return [{"role": "system", "content": f"# Conversation so far\n\n{text}"}]


def _transcript(chat: Chat, agent: Agent, before_message_id: int | None) -> tuple[list[dict[str, str]], bool]:
    """The most recent finished messages that fit the token budget, oldest first; and whether any were cut."""
    limit = current_app.config["TRANSCRIPT_MAX_MESSAGES"]
    query = (
        sa.select(Message)
        .options(joinedload(Message.user), joinedload(Message.agent))
        .where(Message.chat_id == chat.id, Message.status == "done", Message.content != "")
        .order_by(Message.id.desc())
        .limit(limit + 1)
    )
    if before_message_id is not None:
        query = query.where(Message.id < before_message_id)
    if chat.compacted_through_message_id:
        query = query.where(Message.id > chat.compacted_through_message_id)
    newest_first = list(db.session.scalars(query))
    budget = chat.transcript_token_budget or current_app.config["TRANSCRIPT_TOKEN_BUDGET"]
    kept: list[dict[str, str]] = []
    used = 0
    for message in newest_first[:limit]:
        entry = _transcript_entry(message, agent)
        used += count_tokens(entry["content"])
        if used > budget and kept:
            break
        kept.append(entry)
    return kept[::-1], len(kept) < len(newest_first)


def _transcript_entry(message: Message, agent: Agent) -> dict[str, str]:
    if message.role == "assistant" and message.agent_id == agent.id:
        return {"role": "assistant", "content": message.content}
    return {"role": "user", "content": f"{message.author_name}: {message.content}"}


def _memory_section(agent: Agent, now: datetime) -> str:
    memories = list(db.session.scalars(prompt_memories(agent.id, now)))
    core = [m for m in memories if m.memory_type == "core"]
    journal = [m for m in memories if m.memory_type == "journal"]
    if not memories:
        return "# Your memory\n\nYou have no memories yet."
    lines = ["# Your memory"]
    if core:
        lines += ["", "## Core memories (permanent)", *(f"- {m.content}" for m in core)]
    if journal:
        lines += ["", "## Journal (last 7 days)", *(f"- {_date(m)}: {m.content}" for m in journal)]
    return "\n".join(lines)


def _date(memory: AgentMemory) -> str:
    return memory.created_at.strftime("%Y-%m-%d")


def _other_conversations_section(chat: Chat, agent: Agent) -> str | None:
    """Spec 003: the agent's own summaries of its other active chats, under their opaque ids."""
    summaries = agent.other_conversation_summaries(exclude_chat_id=chat.id)
    if not summaries:
        return None
    return render(
        "cross_conversation/other_conversations.txt",
        summaries=summaries,
        can_borrow="borrow_context" in (agent.enabled_tools or []),
    )


def _staged_borrowed_context(chat: Chat, agent: Agent) -> dict[str, Any] | None:
    """What the agent borrowed for this chat, read fresh from the database (not the session's copy)."""
    staged = db.session.scalar(
        sa.select(ChatAgent.borrowed_context_json).where(
            ChatAgent.chat_id == chat.id, ChatAgent.agent_id == agent.id
        )
    )
    return staged or None


def _borrowed_section(borrowed: dict[str, Any] | None) -> str | None:
    if not borrowed or not borrowed.get("messages"):
        return None
    return render("cross_conversation/borrowed_context.txt", borrowed=borrowed)


def _now_section(chat: Chat, agent: Agent, now: datetime) -> str:
    agents = [f"{a.name} (you)" if a.id == agent.id else f"{a.name} (agent)" for a in chat.agents]
    people = db.session.scalars(
        sa.select(User)
        .where(User.id.in_(sa.select(Message.user_id).where(Message.chat_id == chat.id)))
        .order_by(User.id)
    )
    participants = agents + [f"{u.display_name} (person)" for u in people]
    return (
        f"# Now\n\nCurrent time: {now:%Y-%m-%d %H:%M} UTC\n"
        f"Conversation: {chat.display_title}\nParticipants: {', '.join(participants)}"
    )
