"""An agent as a cairn-agent file (docs/agent-file.md): its settings, every memory, its audit trail, its
refinement sessions and, with chats, its conversations and the provenance of its replies. Rows are named by
references of the file (m1, a1, c1, msg1), never by database ids; people by name and e-mail."""

from collections import defaultdict
from typing import Any

import sqlalchemy as sa

from webapp.agent_files.export_chats import (
    chat_entry,
    included_chats,
    messages_of,
    people_of,
    referenced_chats,
    sources_of,
)
from webapp.agent_files.naming import Refs, iso, person
from webapp.agent_files.schema import DATA_REFS, FORMAT, VERSION, names_an_id
from webapp.extensions import db
from webapp.models import Agent, AgentMemory, AuditLog, MemorySource, User
from webapp.models.access import ChatNames
from webapp.timeutil import utcnow

AUDITED = ("AgentMemory", "Agent")  # the rows of an agent's audit trail: its memories' and its sessions'
SESSION_START = "memory_refinement_start"
SESSION_CLOSING = (
    "memory_refinement_complete",
    "memory_refinement_incomplete",
    "memory_refinement_rolled_back",
    "memory_refinement_interrupted",
)
AGENT_EXPORT = "agent_export"  # the audit row of each export


def export_agent(agent: Agent, *, with_chats: bool = False, reader: User | None = None) -> dict[str, Any]:
    """The agent as a cairn-agent document. `reader`: the admin downloading it, whose private chats of others
    are named without their title and never included; None (the command line): every chat of the agent."""
    refs = Refs()
    memories = list(
        db.session.scalars(
            sa.select(AgentMemory).where(AgentMemory.agent_id == agent.id).order_by(AgentMemory.id)
        )
    )
    for memory in memories:
        refs.add("memory", memory.id)
    rows = _audit_rows(agent, refs)
    included = included_chats(agent, reader) if with_chats else []
    messages = messages_of([chat.id for chat in included])
    sources = sources_of(agent, messages)
    chats = referenced_chats(agent, memories, rows, included, sources, messages)
    for chat in chats:
        refs.add("chat", chat.id)
    for message in messages:
        refs.add("message", message.id)
    names = ChatNames.among(reader, [chat.id for chat in chats])
    included_ids = {chat.id for chat in included}
    by_chat = defaultdict(list)
    for message in messages:
        by_chat[message.chat_id].append(message)
    people = people_of([chat.id for chat in chats])
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
            chat_entry(
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


def _memory(memory: AgentMemory, refs: Refs, source_ids: list[int]) -> dict[str, Any]:
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


def _audit_rows(agent: Agent, refs: Refs) -> list[tuple[AuditLog, User | None]]:
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


def _audit_row(row: AuditLog, user: User | None, refs: Refs) -> dict[str, Any]:
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


def _data(data: dict[str, Any], refs: Refs) -> dict[str, Any]:
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
