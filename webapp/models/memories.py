import hashlib
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship, validates

from webapp.extensions import db
from webapp.models.agents import Agent
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

MEMORY_TYPES = ("journal", "core")
MAX_CONTENT_CHARS = 10_000
JOURNAL_WINDOW = timedelta(days=7)


class ConstitutionalMemoryError(ValueError):
    """Raised by any attempt to delete or merge away a constitutional memory."""


def content_hash_of(content: str) -> str:
    """The hash two memories share when they say the same thing (case and outer space ignored)."""
    return hashlib.sha256(content.strip().lower().encode()).hexdigest()


class AgentMemory(db.Model):
    __tablename__ = "agent_memories"
    __table_args__ = (
        sa.CheckConstraint(f"length(content) BETWEEN 1 AND {MAX_CONTENT_CHARS}", name="content_length"),
        sa.Index(
            "ix_agent_memories_agent_id_memory_type_created_at", "agent_id", "memory_type", "created_at"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    agent_id: Mapped[int] = mapped_column(sa.ForeignKey("agents.id"))
    content: Mapped[str] = mapped_column(sa.Text)
    memory_type: Mapped[str] = mapped_column(
        sa.Enum(*MEMORY_TYPES, name="memory_type", native_enum=False, create_constraint=True)
    )
    constitutional: Mapped[bool] = mapped_column(default=False, index=True)
    deleted_at: Mapped[datetime | None] = mapped_column(index=True)
    content_hash: Mapped[str | None] = mapped_column(sa.String(64), index=True)
    token_estimate: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    agent: Mapped[Agent] = relationship()

    @validates("content")
    def _validate_content(self, _key: str, content: str) -> str:
        content = (content or "").strip()
        if not 1 <= len(content) <= MAX_CONTENT_CHARS:
            raise ValueError(f"Memory content must be 1 to {MAX_CONTENT_CHARS:,} characters.")
        self.content_hash = content_hash_of(content)
        self.token_estimate = count_tokens(content)
        return content

    @validates("memory_type")
    def _validate_memory_type(self, _key: str, memory_type: str) -> str:
        if memory_type not in MEMORY_TYPES:
            raise ValueError(f"Memory type must be one of {', '.join(MEMORY_TYPES)}.")
        return memory_type

    @validates("deleted_at")
    def _validate_deleted_at(self, _key: str, deleted_at: datetime | None) -> datetime | None:
        # The model itself refuses, so no path (tool, job, admin page) can delete a constitutional memory.
        if deleted_at is not None and self.constitutional:
            raise ConstitutionalMemoryError(f"Memory #{self.id} is constitutional and cannot be deleted.")
        return deleted_at

    @property
    def is_deleted(self) -> bool:
        return self.deleted_at is not None

    def is_expired(self, now: datetime) -> bool:
        """A journal entry older than the journal window has faded from prompts."""
        return self.memory_type == "journal" and self.created_at < now - JOURNAL_WINDOW

    def soft_delete(self) -> None:
        self.deleted_at = utcnow()

    def restore(self) -> None:
        self.deleted_at = None

    def snapshot(self) -> dict[str, Any]:
        """Everything a change can alter, as audit rows store it for diffs and rollback."""
        return {
            "content": self.content,
            "memory_type": self.memory_type,
            "constitutional": self.constitutional,
            "deleted_at": self.deleted_at.isoformat() if self.deleted_at else None,
        }

    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Put the memory back exactly as a snapshot describes it (flags first, so deletion is allowed)."""
        self.constitutional = snapshot["constitutional"]
        self.content = snapshot["content"]
        self.memory_type = snapshot["memory_type"]
        deleted_at = snapshot["deleted_at"]
        self.deleted_at = datetime.fromisoformat(deleted_at) if deleted_at else None


def active_memories(agent_id: int) -> sa.Select:
    """Every memory of the agent that is not soft-deleted: the one scope all reads of memory go through."""
    return sa.select(AgentMemory).where(AgentMemory.agent_id == agent_id, AgentMemory.deleted_at.is_(None))


def prompt_memories(agent_id: int, now: datetime) -> sa.Select:
    """Active core memories, then active journal entries of the last 7 days, oldest first within each."""
    fresh_journal = sa.and_(
        AgentMemory.memory_type == "journal", AgentMemory.created_at >= now - JOURNAL_WINDOW
    )
    return (
        active_memories(agent_id)
        .where(sa.or_(AgentMemory.memory_type == "core", fresh_journal))
        .order_by(
            sa.case((AgentMemory.memory_type == "core", 0), else_=1), AgentMemory.created_at, AgentMemory.id
        )
    )


def core_memories(agent_id: int) -> sa.Select:
    """The agent's active core memories, oldest first."""
    return (
        active_memories(agent_id)
        .where(AgentMemory.memory_type == "core")
        .order_by(AgentMemory.created_at, AgentMemory.id)
    )


def like_pattern(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, with its own % and _ taken literally (DESIGN.md 5.8)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"
