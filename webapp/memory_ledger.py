"""Every change to a memory is recorded the same way, so the ledger can show it, diff it and undo it."""

from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import AgentMemory, AuditLog
from webapp.models.memories import core_memories
from webapp.timeutil import utcnow


class UndoConflict(ValueError):
    """The memory has changed since the change being undone; undo the later change first."""


def record_change(
    memory: AgentMemory,
    action: str,
    before: dict[str, Any] | None,
    *,
    via: str,
    user_id: int | None = None,
    session_id: str | None = None,
    **extra: Any,
) -> AuditLog:
    """Add the audit row for a change just made to `memory` (before: its snapshot first; None when created)."""
    db.session.flush()  # a new memory gets its id
    return AuditLog.record(
        action,
        memory,
        account_id=memory.agent.account_id,
        agent_id=memory.agent_id,
        user_id=user_id,
        session_id=session_id,
        before=before,
        after=memory.snapshot(),
        via=via,
        **extra,
    )


def _gone(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The state that undoes a creation: the same memory, unprotected and deleted."""
    return {**snapshot, "constitutional": False, "deleted_at": utcnow().isoformat()}


def undo(row: AuditLog, *, user_id: int | None, via: str, session_id: str | None = None) -> AuditLog:
    """Put the memory back as it was before `row`'s change, and record that as a change of its own."""
    memory = db.session.get(AgentMemory, row.auditable_id)
    after = row.data.get("after")
    if memory is None or after is None or row.auditable_type != "AgentMemory":
        raise UndoConflict("This change cannot be undone.")
    if memory.snapshot() != after:
        raise UndoConflict("The memory has changed since; undo the later change first.")
    before = memory.snapshot()
    memory.apply_snapshot(row.data.get("before") or _gone(after))
    return record_change(
        memory, "memory_undo", before, via=via, user_id=user_id, session_id=session_id, undo_of=row.id
    )


def session_rows(session_id: str) -> list[AuditLog]:
    """The memory changes of one refinement session, newest first (the order to undo them in)."""
    return list(
        db.session.scalars(
            sa.select(AuditLog)
            .where(AuditLog.session_id == session_id, AuditLog.auditable_type == "AgentMemory")
            .where(AuditLog.action.not_in(("memory_undo", "memory_rollback")))
            .order_by(AuditLog.id.desc())
        )
    )


def rollback_session(session_id: str, *, user_id: int | None, via: str) -> int:
    """Undo every memory change of a session, newest first, restoring content, type, flags and deletion.

    Refuses (UndoConflict, nothing flushed is kept by the caller) when a memory changed after the session."""
    restored = 0
    for row in session_rows(session_id):
        memory = db.session.get(AgentMemory, row.auditable_id)
        if memory is None:  # memories are never hard-deleted by Cairn; nothing to restore if one was
            continue
        if memory.snapshot() != row.data["after"]:
            raise UndoConflict(f"Memory #{memory.id} has changed since this session; undo that change first.")
        before = memory.snapshot()
        memory.apply_snapshot(row.data.get("before") or _gone(row.data["after"]))
        record_change(
            memory, "memory_rollback", before, via=via, user_id=user_id, session_id=session_id, undo_of=row.id
        )
        restored += 1
    return restored


def dedup_for_agent(agent_id: int, *, session_id: str | None, via: str) -> int:
    """Soft-delete repeated active core memories (same content_hash), keeping the oldest and every
    constitutional one; returns how many were removed."""
    duplicated = (
        sa.select(AgentMemory.content_hash)
        .where(
            AgentMemory.agent_id == agent_id,
            AgentMemory.memory_type == "core",
            AgentMemory.deleted_at.is_(None),
        )
        .group_by(AgentMemory.content_hash)
        .having(sa.func.count() > 1)
    )
    rows = db.session.scalars(
        core_memories(agent_id)
        .where(AgentMemory.content_hash.in_(duplicated))
        .order_by(None)
        .order_by(
            AgentMemory.content_hash,
            AgentMemory.constitutional.desc(),
            AgentMemory.created_at,
            AgentMemory.id,
        )
    ).all()
    removed, seen = 0, set()
    for memory in rows:
        if memory.content_hash not in seen or memory.constitutional:
            seen.add(memory.content_hash)
            continue
        before = memory.snapshot()
        memory.soft_delete()
        record_change(memory, "memory_dedup", before, via=via, session_id=session_id)
        removed += 1
    db.session.commit()
    return removed
