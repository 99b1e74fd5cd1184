import hashlib
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.hybrid import hybrid_method, hybrid_property
from sqlalchemy.orm import Mapped, backref, mapped_column, relationship, validates

from webapp.extensions import JSON, db
from webapp.models import public_ids
from webapp.models.agents import DEFAULT_CORE_TOKEN_BUDGET, Agent
from webapp.models.chats import Message
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

MEMORY_TYPES = ("journal", "core")
# Who may hear a memory (webapp.models.access): whoever may read the chat it came from now, or everyone of the
# account (an admin's ledger entry, or one an admin widened).
AUDIENCES = ("chat", "everyone")
MAX_CONTENT_CHARS = 10_000
JOURNAL_WINDOW = timedelta(days=7)


class ConstitutionalMemoryError(ValueError):
    """Raised by any attempt to delete or merge away a constitutional memory."""


def normalized(content: str) -> str:
    """The text two memories share when they differ only in case, spacing or punctuation."""
    words = re.sub(r"[^\w\s]", " ", content.casefold()).split()
    return " ".join(words) or content.strip().casefold()


def content_hash_of(content: str) -> str:
    """The hash two memories share when they say the same thing (case, spacing and punctuation ignored)."""
    return hashlib.sha256(normalized(content).encode()).hexdigest()


def checked_content(content: str | None) -> str:
    """A memory's text as it is kept (stripped), or ValueError when it is empty or too long."""
    content = (content or "").strip()
    if not 1 <= len(content) <= MAX_CONTENT_CHARS:
        raise ValueError(f"Memory content must be 1 to {MAX_CONTENT_CHARS:,} characters.")
    return content


class AgentMemory(db.Model):
    __tablename__ = "agent_memories"
    __table_args__ = (
        sa.CheckConstraint(f"length(content) BETWEEN 1 AND {MAX_CONTENT_CHARS}", name="content_length"),
        sa.Index(
            "ix_agent_memories_agent_id_memory_type_created_at", "agent_id", "memory_type", "created_at"
        ),
        sa.CheckConstraint("audience = 'everyone' OR chat_id IS NOT NULL", name="audience_chat"),
        # A search's scope (an agent's active memories that may be heard) read from the index alone.
        sa.Index(
            "ix_agent_memories_search_scope",
            "agent_id",
            "deleted_at",
            "constitutional",
            "audience",
            "chat_id",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    agent_id: Mapped[int] = mapped_column(sa.ForeignKey("agents.id"))
    content: Mapped[str] = mapped_column(sa.Text)
    memory_type: Mapped[str] = mapped_column(
        sa.Enum(*MEMORY_TYPES, name="memory_type", native_enum=False, create_constraint=True)
    )
    constitutional: Mapped[bool] = mapped_column(default=False, index=True)
    # The conversation it came from (None: an admin's entry, or from before memories had an audience).
    chat_id: Mapped[int | None] = mapped_column(sa.ForeignKey("chats.id"), index=True)
    audience: Mapped[str] = mapped_column(
        sa.Enum(*AUDIENCES, name="memory_audience", native_enum=False, create_constraint=True),
        default=lambda context: "chat" if context.get_current_parameters().get("chat_id") else "everyone",
    )
    deleted_at: Mapped[datetime | None] = mapped_column(index=True)
    content_hash: Mapped[str | None] = mapped_column(sa.String(64), index=True)
    token_estimate: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    agent: Mapped[Agent] = relationship()

    @validates("content")
    def _validate_content(self, _key: str, content: str) -> str:
        content = checked_content(content)
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

    # Each state of a memory is defined once, for an instance and (as SQL) for a query, alias or subquery.
    @hybrid_property
    def is_active(self) -> bool:
        """Not soft-deleted."""
        return self.deleted_at is None

    @is_active.inplace.expression
    @classmethod
    def _is_active_expression(cls) -> sa.ColumnElement[bool]:
        return cls.deleted_at.is_(None)

    @hybrid_property
    def is_deleted(self) -> bool:
        """Soft-deleted (it can be restored)."""
        return self.deleted_at is not None

    @is_deleted.inplace.expression
    @classmethod
    def _is_deleted_expression(cls) -> sa.ColumnElement[bool]:
        return cls.deleted_at.is_not(None)

    @hybrid_method
    def in_journal_window(self, now: datetime) -> bool:
        """A journal entry of the last 7 days: it still reaches prompts."""
        return self.in_journal_since(now - JOURNAL_WINDOW)

    @in_journal_window.inplace.expression
    @classmethod
    def _in_journal_window_expression(cls, now: datetime) -> sa.ColumnElement[bool]:
        return cls.in_journal_since(now - JOURNAL_WINDOW)

    @hybrid_method
    def in_journal_since(self, start: datetime) -> bool:
        """A journal entry made since `start` (in SQL, a datetime or a bound parameter given one)."""
        return self.memory_type == "journal" and self.created_at >= start

    @in_journal_since.inplace.expression
    @classmethod
    def _in_journal_since_expression(cls, start: datetime | sa.BindParameter) -> sa.ColumnElement[bool]:
        return sa.and_(cls.memory_type == "journal", cls.created_at >= start)

    @hybrid_method
    def is_expired(self, now: datetime) -> bool:
        """A journal entry older than the journal window has faded from prompts."""
        return self.memory_type == "journal" and self.created_at < now - JOURNAL_WINDOW

    @is_expired.inplace.expression
    @classmethod
    def _is_expired_expression(cls, now: datetime) -> sa.ColumnElement[bool]:
        return sa.and_(cls.memory_type == "journal", cls.created_at < now - JOURNAL_WINDOW)

    @property
    def heard_by(self) -> str:
        """Who may hear it, as the agent's own jobs tell it: "everyone", or "conversation <its opaque id>"."""
        if self.audience == "chat":
            return f"conversation {public_ids.encode(self.chat_id)}"
        return "everyone"

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
            "audience": self.audience,
        }

    def matches_snapshot(self, snapshot: dict[str, Any]) -> bool:
        """The memory is as the snapshot describes it (in what it records: older audit rows have no audience)."""
        current = self.snapshot()
        return all(current[key] == value for key, value in snapshot.items() if key in current)

    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Put the memory back exactly as a snapshot describes it (flags first, so deletion is allowed)."""
        self.constitutional = snapshot["constitutional"]
        self.content = snapshot["content"]
        self.memory_type = snapshot["memory_type"]
        self.audience = snapshot.get("audience", self.audience)  # rows audited before audiences have none
        deleted_at = snapshot["deleted_at"]
        self.deleted_at = datetime.fromisoformat(deleted_at) if deleted_at else None


class MemorySource(db.Model):
    """A message a memory was drawn from (issue 33): the turns an extraction named, the person's message (and the
    agent's reply it quotes) behind a save_memory call; a merge keeps its parts' sources, a rewrite or promotion
    its own. Read within chats the access rule admits (webapp.search.sources, the ledger): a source is shown
    only to whoever may read its chat."""

    __tablename__ = "memory_sources"

    memory_id: Mapped[int] = mapped_column(
        sa.ForeignKey("agent_memories.id", ondelete="CASCADE"), primary_key=True
    )
    message_id: Mapped[int] = mapped_column(
        sa.ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True, index=True
    )


def add_sources(memory: AgentMemory, message_ids: Sequence[int]) -> None:
    """Record the messages a new memory came from (flushing it for its id); none is nothing to record."""
    if not message_ids:
        return
    db.session.flush()  # for its id (flushing one object alone is deprecated)
    db.session.add_all(MemorySource(memory_id=memory.id, message_id=i) for i in dict.fromkeys(message_ids))


def source_ids(memory_ids: Sequence[int]) -> list[int]:
    """The ids of the messages these memories came from, oldest first, each once (a merge keeps them all)."""
    if not memory_ids:
        return []
    return list(
        db.session.scalars(
            sa.select(MemorySource.message_id)
            .where(MemorySource.memory_id.in_(memory_ids))
            .distinct()
            .order_by(MemorySource.message_id)
        )
    )


# The scopes: each set of memories the app reads is defined here once. `agent_id` may be a column (Agent.id)
# to correlate a scope with a query over agents.


def active_memories(agent_id: Any) -> sa.Select:
    """Every memory of the agent that is not soft-deleted: the one scope all reads of memory go through."""
    return sa.select(AgentMemory).where(AgentMemory.agent_id == agent_id, AgentMemory.is_active)


def deleted_memories(agent_id: Any) -> sa.Select:
    """The agent's soft-deleted memories (the ledger's "deleted" filter)."""
    return sa.select(AgentMemory).where(AgentMemory.agent_id == agent_id, AgentMemory.is_deleted)


def core_memories(agent_id: Any) -> sa.Select:
    """The agent's active core memories, oldest first."""
    return (
        active_memories(agent_id)
        .where(AgentMemory.memory_type == "core")
        .order_by(AgentMemory.created_at, AgentMemory.id)
    )


def recent_journal(agent_id: Any, now: datetime) -> sa.Select:
    """The agent's active journal entries of the last 7 days, oldest first."""
    return (
        active_memories(agent_id)
        .where(AgentMemory.in_journal_window(now))
        .order_by(AgentMemory.created_at, AgentMemory.id)
    )


def prompt_memories(agent_id: Any, journal_since: Any) -> sa.Select:
    """What a prompt may list: active core memories and the journal since the start of its window, `now -
    JOURNAL_WINDOW` (unordered); the agent's id and the start may be bound parameters."""
    return active_memories(agent_id).where(
        sa.or_(AgentMemory.memory_type == "core", AgentMemory.in_journal_since(journal_since))
    )


def core_tokens(agent_id: Any) -> sa.Select:
    """The tokens of the agent's active core memories, as a one-value query."""
    return (
        core_memories(agent_id)
        .order_by(None)
        .with_only_columns(sa.func.coalesce(sa.func.sum(AgentMemory.token_estimate), 0))
    )


def core_token_usage(agent_id: int) -> int:
    """Tokens of the agent's active core memories."""
    return int(db.session.scalar(core_tokens(agent_id)))


def needs_refinement(agent: Agent) -> bool:
    """True when the agent's active core memories are over its token budget."""
    return core_token_usage(agent.id) > (agent.core_token_budget or DEFAULT_CORE_TOKEN_BUDGET)


def like_pattern(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, with its own % and _ taken literally (DESIGN.md 5.8)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class ReplySources(db.Model):
    """What a reply's prompt held (ids, no copies): its memories, summaries, borrowed and recalled context."""

    __tablename__ = "reply_sources"

    message_id: Mapped[int] = mapped_column(
        sa.ForeignKey("messages.id", ondelete="CASCADE"), primary_key=True
    )
    memory_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    recalled_memory_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    recalled_chat_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    # The chat's own summary of its compacted history, and the other chats whose summaries were listed.
    conversation_summary: Mapped[bool] = mapped_column(default=False)
    summary_chat_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    borrowed_chat_id: Mapped[int | None] = mapped_column(sa.ForeignKey("chats.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    # Loaded with a page of messages in one more query (selectin), so the chat page stays constant.
    message: Mapped[Message] = relationship(backref=backref("sources", uselist=False, lazy="selectin"))

    @property
    def memory_count(self) -> int:
        return len(set(self.memory_ids) | set(self.recalled_memory_ids))
