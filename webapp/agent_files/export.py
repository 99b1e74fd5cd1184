"""An agent as a cairn-agent file (docs/agent-file.md): its settings, every memory, its audit trail, its
refinement sessions and, with chats, its conversations and the provenance of its replies. Rows are named by
references of the file (m1, a1, c1, msg1), never by database ids; people by name and e-mail."""

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import joinedload

from webapp.agent_files.schema import DATA_REFS, FORMAT, VERSION, names_an_id, ref
from webapp.extensions import db
from webapp.models import (
    Agent,
    AgentMemory,
    AuditLog,
    Chat,
    ChatAgent,
    ChatPerson,
    MemorySource,
    Message,
    ReplySources,
    User,
)
from webapp.models.access import ChatNames, readable_chats
from webapp.timeutil import utcnow
from webapp.tools.steps import may_name_a_chat, unnamed

AUDITED = ("AgentMemory", "Agent")  # the rows of an agent's audit trail: its memories' and its sessions'
SESSION_START = "memory_refinement_start"
SESSION_CLOSING = (
    "memory_refinement_complete",
    "memory_refinement_incomplete",
    "memory_refinement_rolled_back",
    "memory_refinement_interrupted",
)
AGENT_EXPORT = "agent_export"  # the audit row of each export
CHAT_IMPORT = "chat_import"  # the audit row an import writes on each chat it makes
UNFINISHED = "It was not finished when the agent was exported."


def iso(moment: datetime | None) -> str | None:
    """A stored (naive UTC) time as ISO 8601 with its offset."""
    return moment.replace(tzinfo=UTC).isoformat() if moment else None


def person(user: User | None) -> dict[str, Any] | None:
    return {"name": user.display_name, "email": user.email} if user else None


class _Refs:
    """Database ids to the file's references, kind by kind, numbered in the order they are added."""

    def __init__(self) -> None:
        self.ids: dict[str, dict[int, str]] = defaultdict(dict)

    def add(self, kind: str, row_id: int) -> None:
        known = self.ids[kind]
        if row_id not in known:
            known[row_id] = ref(kind, len(known) + 1)

    def get(self, kind: str, row_id: Any) -> str | None:
        return self.ids[kind].get(row_id) if isinstance(row_id, int) else None

    def all(self, kind: str, row_ids: list[Any] | None) -> list[str]:
        return [found for row_id in row_ids or () if (found := self.get(kind, row_id))]


def export_agent(agent: Agent, *, with_chats: bool = False, reader: User | None = None) -> dict[str, Any]:
    """The agent as a cairn-agent document. `reader`: the admin downloading it, whose private chats of others
    are named without their title and never included; None (the command line): every chat of the agent."""
    refs = _Refs()
    memories = list(
        db.session.scalars(
            sa.select(AgentMemory).where(AgentMemory.agent_id == agent.id).order_by(AgentMemory.id)
        )
    )
    for memory in memories:
        refs.add("memory", memory.id)
    rows = _audit_rows(agent, refs)
    included = _included_chats(agent, reader) if with_chats else []
    messages = _messages([chat.id for chat in included])
    sources = _sources(agent, messages)
    chats = _referenced_chats(agent, memories, rows, included, sources, messages)
    for chat in chats:
        refs.add("chat", chat.id)
    for message in messages:
        refs.add("message", message.id)
    names = ChatNames.among(reader, [chat.id for chat in chats])
    included_ids = {chat.id for chat in included}
    by_chat = defaultdict(list)
    for message in messages:
        by_chat[message.chat_id].append(message)
    people = _people([chat.id for chat in chats])
    memory_sources = _memory_sources(agent)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": iso(utcnow()),
        "exported_by": person(reader),
        "with_chats": with_chats,
        "agent": _settings(agent),
        "memories": [_memory(memory, refs, memory_sources.get(memory.id, [])) for memory in memories],
        "audit": [_audit_row(row, user, refs) for row, user in rows],
        "sessions": _sessions([row for row, _user in rows]),
        "chats": [
            _chat(
                chat,
                agent,
                refs,
                people=people[chat.id],
                messages=by_chat[chat.id] if chat.id in included_ids else None,
                sources=sources,
                names=names,
            )
            for chat in chats
        ],
    }


def _settings(agent: Agent) -> dict[str, Any]:
    return {
        "name": agent.name,
        "slug": agent.slug,
        "system_prompt": agent.system_prompt,
        "model_id": agent.model_id,
        "enabled_tools": list(agent.enabled_tools or []),
        "core_token_budget": agent.core_token_budget,
        "memory_token_budget": agent.memory_token_budget,
        "members_see_memory": agent.members_see_memory,
        "consolidates_direct_chats": agent.consolidates_direct_chats,
        "paused": agent.paused,
        "background_changes": agent.background_changes,
        "last_refinement_at": iso(agent.last_refinement_at),
        "created_at": iso(agent.created_at),
        "updated_at": iso(agent.updated_at),
    }


def _memory_sources(agent: Agent) -> dict[int, list[int]]:
    """The ids of the messages each of the agent's memories came from, oldest first."""
    found = defaultdict(list)
    for memory_id, message_id in db.session.execute(
        sa.select(MemorySource.memory_id, MemorySource.message_id)
        .join(AgentMemory, AgentMemory.id == MemorySource.memory_id)
        .where(AgentMemory.agent_id == agent.id)
        .order_by(MemorySource.message_id)
    ):
        found[memory_id].append(message_id)
    return found


def _memory(memory: AgentMemory, refs: _Refs, source_ids: list[int]) -> dict[str, Any]:
    """A memory, with the messages it came from that the file carries (those of the chats the reader may read
    and included)."""
    entry = {
        "ref": refs.get("memory", memory.id),
        "memory_type": memory.memory_type,
        "constitutional": memory.constitutional,
        "content": memory.content,
        "audience": memory.audience,
        "chat": refs.get("chat", memory.chat_id),
        "created_at": iso(memory.created_at),
        "updated_at": iso(memory.updated_at),
        "deleted_at": iso(memory.deleted_at),
    }
    sources = refs.all("message", source_ids)
    return entry | {"sources": sources} if sources else entry


def _audit_rows(agent: Agent, refs: _Refs) -> list[tuple[AuditLog, User | None]]:
    """The agent's audit trail (its memories' rows and its sessions'), oldest first, with who acted."""
    found = db.session.execute(
        sa.select(AuditLog, User)
        .outerjoin(User, User.id == AuditLog.user_id)
        .where(
            AuditLog.agent_id == agent.id,
            AuditLog.account_id == agent.account_id,
            AuditLog.auditable_type.in_(AUDITED),
        )
        .order_by(AuditLog.id)
    ).all()
    rows = []
    for row, user in found:
        if row.auditable_type == "Agent" and row.auditable_id != agent.id:
            continue  # not about this agent
        if row.auditable_type == "AgentMemory" and refs.get("memory", row.auditable_id) is None:
            continue  # not about one of its memories
        refs.add("audit", row.id)
        rows.append((row, user))
    return rows


def _audit_row(row: AuditLog, user: User | None, refs: _Refs) -> dict[str, Any]:
    data = dict(row.data or {})
    via = data.pop("via", None)
    who = person(user) or data.pop(
        "who", None
    )  # an imported row by someone of another account keeps its text
    data.pop("who", None)
    return {
        "ref": refs.get("audit", row.id),
        "action": row.action,
        "target": "agent" if row.auditable_type == "Agent" else refs.get("memory", row.auditable_id),
        "who": who,
        "via": via,
        "session": row.session_id,
        "data": _data(data, refs),
        "created_at": iso(row.created_at),
    }


def _data(data: dict[str, Any], refs: _Refs) -> dict[str, Any]:
    """An audit row's data with its ids as references; ids of rows the format does not carry are left out."""
    out = {}
    for key, value in data.items():
        if key in DATA_REFS:
            found = refs.get(DATA_REFS[key], value)
            if found is not None or DATA_REFS[key] in ("chat", "message"):
                out[key] = found
        elif not names_an_id(key):
            out[key] = value
    return out


def _sessions(rows: list[AuditLog]) -> list[dict[str, Any]]:
    """Each refinement session of the trail: when it started, how it closed, how many memory changes it made."""
    sessions: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.action == SESSION_START and row.session_id:
            sessions[row.session_id] = {
                "session": row.session_id,
                "started_at": iso(row.created_at),
                "closed_by": None,
                "changes": 0,
            }
    for row in rows:
        session = sessions.get(row.session_id or "")
        if session is None:
            continue
        if row.action in SESSION_CLOSING:
            session["closed_by"] = row.action
        elif row.auditable_type == "AgentMemory":
            session["changes"] += 1
    return list(sessions.values())


def _included_chats(agent: Agent, reader: User | None) -> list[Chat]:
    """The agent's chats whose messages the file carries: every one, or those the downloading admin may read."""
    query = (
        sa.select(Chat)
        .join(ChatAgent, ChatAgent.chat_id == Chat.id)
        .where(ChatAgent.agent_id == agent.id, Chat.account_id == agent.account_id)
        .order_by(Chat.id)
    )
    if reader is not None:
        query = query.where(readable_chats(reader))
    return list(db.session.scalars(query))


def _messages(chat_ids: list[int]) -> list[Message]:
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


def _sources(agent: Agent, messages: list[Message]) -> dict[int, ReplySources]:
    """The provenance of the agent's own replies among the messages."""
    own = [m.id for m in messages if m.agent_id == agent.id]
    if not own:
        return {}
    return {
        s.message_id: s
        for s in db.session.scalars(sa.select(ReplySources).where(ReplySources.message_id.in_(own)))
    }


def _referenced_chats(
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


def _people(chat_ids: list[int]) -> dict[int, list[User]]:
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


def _chat(
    chat: Chat,
    agent: Agent,
    refs: _Refs,
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


def _at_or_before(messages: list[Message], cursor: int | None, refs: _Refs) -> str | None:
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
    refs: _Refs,
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


def _step(step: Any, refs: _Refs, names: ChatNames) -> Any:
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


def _provenance(sources: ReplySources, refs: _Refs) -> dict[str, Any]:
    return {
        "memories": refs.all("memory", sources.memory_ids),
        "recalled_memories": refs.all("memory", sources.recalled_memory_ids),
        "recalled_chats": refs.all("chat", sources.recalled_chat_ids),
        "summary_chats": refs.all("chat", sources.summary_chat_ids),
        "borrowed_chat": refs.get("chat", sources.borrowed_chat_id),
        "conversation_summary": sources.conversation_summary,
        "created_at": iso(sources.created_at),
    }


def record_export(agent: Agent, document: dict[str, Any], *, user: User | None, via: str) -> AuditLog:
    """Add (not commit) the audit row saying who took the agent out as a file, and how much of it."""
    return AuditLog.record(
        AGENT_EXPORT,
        agent,
        account_id=agent.account_id,
        agent_id=agent.id,
        user_id=user.id if user else None,
        via=via,
        with_chats=document["with_chats"],
        memories=len(document["memories"]),
        audit_rows=len(document["audit"]),
        chats=sum(1 for chat in document["chats"] if chat["included"]),
    )
