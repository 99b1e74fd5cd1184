"""An export's chats: those it carries (with chats: the ones the reader may read) with their messages, the replies'
provenance and tool steps, and those it only refers to (a memory's, an audit row's, a reply's), whose titles the reader
may not read are withheld (access.ChatNames)."""

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import joinedload

from webapp.agent_files.naming import Refs, iso, person
from webapp.agent_files.schema import names_an_id
from webapp.extensions import db
from webapp.models import (
    Agent,
    AgentMemory,
    AuditLog,
    Chat,
    ChatAgent,
    ChatPerson,
    Message,
    ReplySources,
    User,
)
from webapp.models.access import ChatNames, readable_chats, remembered
from webapp.tools.steps import may_name_a_chat, unnamed

CHAT_IMPORT = "chat_import"  # the audit row an import writes on each chat it makes
UNFINISHED = "It was not finished when the agent was exported."


def included_chats(agent: Agent, reader: User | None) -> list[Chat]:
    """The agent's chats whose messages the file carries: every one, or those the downloading admin may read; never
    a temporary chat (the agent keeps nothing of it)."""
    query = (
        sa.select(Chat)
        .join(ChatAgent, ChatAgent.chat_id == Chat.id)
        .where(ChatAgent.agent_id == agent.id, Chat.account_id == agent.account_id, remembered())
        .order_by(Chat.id)
    )
    if reader is not None:
        query = query.where(readable_chats(reader))
    return list(db.session.scalars(query))


def messages_of(chat_ids: list[int]) -> list[Message]:
    if not chat_ids:
        return []
    return list(
        db.session.scalars(
            sa.select(Message)
            .options(joinedload(Message.user), joinedload(Message.agent))
            .where(Message.chat_id.in_(chat_ids))
            .order_by(Message.chat_id, Message.id)
        )
    )


def sources_of(agent: Agent, messages: list[Message]) -> dict[int, ReplySources]:
    """The provenance of the agent's own replies among the messages."""
    own = [m.id for m in messages if m.agent_id == agent.id]
    if not own:
        return {}
    return {
        s.message_id: s
        for s in db.session.scalars(sa.select(ReplySources).where(ReplySources.message_id.in_(own)))
    }


def referenced_chats(
    agent: Agent,
    memories: list[AgentMemory],
    rows: list[tuple[AuditLog, User | None]],
    included: list[Chat],
    sources: dict[int, ReplySources],
    messages: list[Message],
) -> list[Chat]:
    """The included chats and every chat of the account a memory, an audit row, a reply's sources or a tool
    step names."""
    wanted = {m.chat_id for m in memories} | {chat.id for chat in included}
    wanted |= {
        row.data.get("chat_id") for row, _user in rows if isinstance((row.data or {}).get("chat_id"), int)
    }
    for found in sources.values():
        wanted |= {*found.recalled_chat_ids, *found.summary_chat_ids, found.borrowed_chat_id}
    wanted |= {step.get("chat_id") for m in messages for step in m.tools_used or () if isinstance(step, dict)}
    wanted = {chat_id for chat_id in wanted if isinstance(chat_id, int)}
    if not wanted:
        return []
    return list(
        db.session.scalars(
            sa.select(Chat).where(Chat.id.in_(wanted), Chat.account_id == agent.account_id).order_by(Chat.id)
        )
    )


def people_of(chat_ids: list[int]) -> dict[int, list[User]]:
    """Each chat's people, in the order they joined."""
    people = defaultdict(list)
    if not chat_ids:
        return people
    for chat_id, user in db.session.execute(
        sa.select(ChatPerson.chat_id, User)
        .join(User, User.id == ChatPerson.user_id)
        .where(ChatPerson.chat_id.in_(chat_ids))
        .order_by(ChatPerson.created_at, User.id)
    ):
        people[chat_id].append(user)
    return people


def chat_entry(
    chat: Chat,
    agent: Agent,
    refs: Refs,
    *,
    people: list[User],
    messages: list[Message] | None,
    sources: dict[int, ReplySources],
    names: ChatNames,
) -> dict[str, Any]:
    """A chat: a reference (title withheld when the reader may not read it), or with its messages."""
    entry = {
        "ref": refs.get("chat", chat.id),
        "included": messages is not None,
        "title": chat.title if names.may_name(chat.id) else None,
        "visibility": chat.visibility,
        "source": chat.source,
        "group": chat.manual_responses,
        "people": [person(user) for user in people],
        "started_by": person(db.session.get(User, chat.started_by_id)) if chat.started_by_id else None,
        "created_at": iso(chat.created_at),
        "last_message_at": iso(chat.last_message_at),
        "discarded_at": iso(chat.discarded_at),
    }
    if messages is None:
        return entry
    link = db.session.scalar(
        sa.select(ChatAgent).where(ChatAgent.chat_id == chat.id, ChatAgent.agent_id == agent.id)
    )
    authors, others = _imported(chat.id)
    return {
        **entry,
        "other_agents": others + [other.name for other in chat.agents if other.id != agent.id],
        "joined_at": iso(link.created_at),
        "summary": link.agent_summary,
        "summary_generated_at": iso(link.agent_summary_generated_at),
        "consolidated_through": _at_or_before(messages, link.last_consolidated_message_id, refs),
        "last_consolidated_at": iso(chat.last_consolidated_at),
        "memory_doc": chat.memory_doc,
        "compacted_through": _at_or_before(messages, chat.compacted_through_message_id, refs),
        "messages": [_message(m, agent, refs, sources.get(m.id), authors, names) for m in messages],
    }


def _at_or_before(messages: list[Message], cursor: int | None, refs: Refs) -> str | None:
    """The last message up to a cursor (a message id, perhaps of a message since deleted)."""
    if cursor is None:
        return None
    passed = [m.id for m in messages if m.id <= cursor]
    return refs.get("message", passed[-1]) if passed else None


def _imported(chat_id: int) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """What an import that made the chat kept as text: who wrote the messages it could not tie to a person or
    agent of the account (by message id), and the other agents the chat had."""
    rows = db.session.scalars(
        sa.select(AuditLog).where(
            AuditLog.auditable_type == "Chat",
            AuditLog.auditable_id == chat_id,
            AuditLog.action == CHAT_IMPORT,
        )
    )
    authors: dict[str, dict[str, Any]] = {}
    others: list[str] = []
    for row in rows:
        authors.update((row.data or {}).get("authors", {}))
        others += (row.data or {}).get("other_agents", [])
    return authors, others


def _message(
    message: Message,
    agent: Agent,
    refs: Refs,
    sources: ReplySources | None,
    authors: dict[str, dict[str, Any]],
    names: ChatNames,
) -> dict[str, Any]:
    finished = message.status in ("done", "failed")
    return {
        "ref": refs.get("message", message.id),
        "role": message.role,
        "author": _author(message, agent, authors),
        "content": message.content,
        "status": message.status if finished else "failed",
        "error": message.error if finished else UNFINISHED,
        "tools_used": [_step(step, refs, names) for step in message.tools_used]
        if message.tools_used is not None
        else None,
        "created_at": iso(message.created_at),
        "sources": _provenance(sources, refs) if sources else None,
    }


def _step(step: Any, refs: Refs, names: ChatNames) -> Any:
    """A tool step as stored, naming another chat only when the reader may read it (as the chat page does),
    with the memory saved and the chat borrowed from as the file's references instead of ids."""
    if not isinstance(step, dict):
        return step  # an older reply's step: the tool's name
    if may_name_a_chat(step) and not names.may_name(step.get("chat_id")):
        step = unnamed(step)
    entry = {key: value for key, value in step.items() if not names_an_id(key)}
    if "memory_id" in step:
        entry["memory"] = refs.get("memory", step["memory_id"])
    if "chat_id" in step:
        entry["chat"] = refs.get("chat", step["chat_id"])
    return entry


def _author(message: Message, agent: Agent, authors: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if message.agent_id == agent.id:
        return {"kind": "self", "name": agent.name, "email": None}
    if message.agent is not None:
        return {"kind": "agent", "name": message.agent.name, "email": None}
    if message.user is not None:
        return {"kind": "person", **person(message.user)}
    return authors.get(str(message.id)) or {"kind": "none", "name": message.author_name, "email": None}


def _provenance(sources: ReplySources, refs: Refs) -> dict[str, Any]:
    return {
        "memories": refs.all("memory", sources.memory_ids),
        "recalled_memories": refs.all("memory", sources.recalled_memory_ids),
        "recalled_chats": refs.all("chat", sources.recalled_chat_ids),
        "summary_chats": refs.all("chat", sources.summary_chat_ids),
        "borrowed_chat": refs.get("chat", sources.borrowed_chat_id),
        "conversation_summary": sources.conversation_summary,
        "created_at": iso(sources.created_at),
    }
