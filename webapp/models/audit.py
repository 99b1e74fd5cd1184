"""The audit trail: one row per change to a memory, and its verbs: record a change, undo it, roll back a session."""

from collections import defaultdict
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from webapp.extensions import JSON, db
from webapp.models.access import same_audience
from webapp.models.agents import Agent
from webapp.models.memories import AgentMemory, core_memories, core_token_usage
from webapp.timeutil import utcnow

ROLLED_BACK = "memory_refinement_rolled_back"
# The `via` of a memory_delete made by a person forgetting a memory on its chat's memory page (not the ledger).
FORGOTTEN_VIA = "chat"
# Where a person forgot a memory (the `via` of its memory_delete, webapp.actions.forgetting), as the ledger says it.
FORGOTTEN_WHERE = {
    FORGOTTEN_VIA: "on the memory page of its chat",
    "account": "on “What agents remember of me”",
    "forget-mcp": "through MCP",
    "forget-cli": "from the command line",
    "removal": "when its person was removed",
}


class AuditLog(db.Model):
    """One row per change to a memory (or other governed record), by a person, an agent or a job."""

    __tablename__ = "audit_logs"
    __table_args__ = (
        sa.Index("ix_audit_logs_auditable", "auditable_type", "auditable_id"),
        sa.Index("ix_audit_logs_account_id_created_at", "account_id", "created_at"),
        sa.Index("ix_audit_logs_agent_id_created_at", "agent_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"))
    # None when a job acted (as the agent named by agent_id).
    user_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id"))
    agent_id: Mapped[int | None] = mapped_column(sa.ForeignKey("agents.id"))
    action: Mapped[str] = mapped_column(sa.String(80), index=True)
    auditable_type: Mapped[str] = mapped_column(sa.String(50))
    auditable_id: Mapped[int]
    # A refinement session (or other batch) groups its rows under one id, so it can be rolled back whole.
    session_id: Mapped[str | None] = mapped_column(sa.String(36), index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @classmethod
    def record(
        cls,
        action: str,
        target: db.Model,
        *,
        account_id: int,
        agent_id: int | None = None,
        user_id: int | None = None,
        session_id: str | None = None,
        **data: Any,
    ) -> "AuditLog":
        """Add (not commit) an audit row for a change to target, so it commits with the change itself."""
        row = cls(
            action=action,
            auditable_type=type(target).__name__,
            auditable_id=target.id,
            account_id=account_id,
            agent_id=agent_id,
            user_id=user_id,
            session_id=session_id,
            data=data,
        )
        db.session.add(row)
        return row


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
    if not memory.matches_snapshot(after):
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
        if not memory.matches_snapshot(row.data["after"]):
            raise UndoConflict(f"Memory #{memory.id} has changed since this session; undo that change first.")
        before = memory.snapshot()
        memory.apply_snapshot(row.data.get("before") or _gone(row.data["after"]))
        record_change(
            memory, "memory_rollback", before, via=via, user_id=user_id, session_id=session_id, undo_of=row.id
        )
        restored += 1
    return restored


def roll_back_session(
    agent: Agent, session_id: str, *, user_id: int | None, via: str, **closing: Any
) -> AuditLog:
    """Roll a refinement session back (rollback_session) and add the one row saying so, on the agent: by a
    person (user_id), or by the session's own circuit breaker (closing: its reason, stats and token figures).

    The only writer of ROLLED_BACK; refuses with UndoConflict as rollback_session does."""
    restored = rollback_session(session_id, user_id=user_id, via=via)
    return AuditLog.record(
        ROLLED_BACK,
        agent,
        account_id=agent.account_id,
        agent_id=agent.id,
        user_id=user_id,
        session_id=session_id,
        via=via,
        restored=restored,
        tokens_after=core_token_usage(agent.id),
        **closing,
    )


def duplicates(agent_id: int) -> list[tuple[AgentMemory, AgentMemory]]:
    """(copy, kept) for each repeated active core memory (same content_hash, heard by the same people): the
    oldest and every constitutional one are kept. A copy heard by other people is no repeat: removing it would
    make the memory go quiet where only that copy may be heard."""
    duplicated = (
        core_memories(agent_id)
        .order_by(None)
        .with_only_columns(AgentMemory.content_hash)
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
    found, kept = [], defaultdict(list)
    for memory in rows:
        copies = kept[memory.content_hash]
        original = next((copy for copy in copies if same_audience(memory, copy)), None)
        if memory.constitutional or original is None:
            copies.append(memory)
        else:
            found.append((memory, original))
    return found


def dedup_for_agent(agent_id: int, *, session_id: str | None, via: str) -> int:
    """Soft-delete the agent's repeated core memories (duplicates()); returns how many were removed."""
    found = duplicates(agent_id)
    for memory, _kept in found:
        before = memory.snapshot()
        memory.soft_delete()
        record_change(memory, "memory_dedup", before, via=via, session_id=session_id)
    db.session.commit()
    return len(found)
