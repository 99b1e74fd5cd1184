"""How a refinement session changes an agent's memory: the verbs (merge, rewrite, remove), each audited as the
session's, whether they apply at once or are staged for review (staging), and within what limits (session_limits).
A staged change is a ProposedChange, kept with the memories it depends on as they were; approving its proposal
(webapp.models.proposals) applies it with the same verbs."""

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from flask import current_app
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.extensions import JSON, db
from webapp.models.access import same_audience
from webapp.models.agents import Agent
from webapp.models.audit import record_change
from webapp.models.drift import drift_of
from webapp.models.memories import AgentMemory, add_sources, checked_content, content_hash_of, source_ids
from webapp.tokens import count_tokens


def merge(
    agent: Agent,
    memories: list[AgentMemory],
    content: str,
    *,
    via: str,
    session_id: str,
    user_id: int | None = None,
    **extra: Any,
) -> AgentMemory:
    """Merge memories (of one audience) into a new core memory dated like the oldest; audit each step."""
    merged = AgentMemory(
        agent=agent,
        content=content,
        memory_type="core",
        created_at=min(m.created_at for m in memories),
        chat_id=memories[0].chat_id,
        audience=memories[0].audience,
    )
    db.session.add(merged)
    add_sources(merged, source_ids([m.id for m in memories]))  # the union of its parts' sources
    audit = dict(via=via, session_id=session_id, user_id=user_id, **extra)
    record_change(merged, "memory_refinement_consolidate_create", None, **audit)
    for memory in memories:
        before = memory.snapshot()
        memory.soft_delete()
        record_change(memory, "memory_refinement_consolidate", before, merged_into=merged.id, **audit)
    return merged


def rewrite(
    memory: AgentMemory, content: str, *, via: str, session_id: str, user_id: int | None = None, **extra: Any
) -> None:
    """Give a memory new text; audit it."""
    before = memory.snapshot()
    memory.content = content
    record_change(
        memory, "memory_refinement_update", before, via=via, session_id=session_id, user_id=user_id, **extra
    )


def remove(
    memories: list[AgentMemory],
    *,
    via: str,
    session_id: str,
    user_id: int | None = None,
    action: str = "memory_refinement_delete",
    **extra: Any,
) -> None:
    """Soft-delete memories; audit each."""
    for memory in memories:
        before = memory.snapshot()
        memory.soft_delete()
        record_change(memory, action, before, via=via, session_id=session_id, user_id=user_id, **extra)


def staging(agent: Agent, now: datetime, threshold: float) -> tuple[str, str | None] | None:
    """Why the agent's background merges, rewrites and deletes are staged now: ("setting", None), ("drift",
    the alarm's reason), or None when they apply at once."""
    if agent.background_changes == "staged":
        return "setting", None
    drift = drift_of(agent.id, now, threshold)
    return ("drift", drift.reason) if drift.alarm else None


def session_limits() -> dict[str, Any]:
    """The cap and floor of a refinement session (settings), which hold for what an approval applies too."""
    config = current_app.config
    return {"max_mutations": config["REFINEMENT_MAX_MUTATIONS"], "floor": config["REFINEMENT_TOKEN_FLOOR"]}


CHANGE_KINDS = ("merge", "rewrite", "delete")


CHANGE_STATUSES = ("pending", "applied", "rejected", "stale")


def _version(memory: AgentMemory) -> dict[str, Any]:
    """A memory as a change depends on it: its snapshot, and when it last changed in any way."""
    return {**memory.snapshot(), "updated_at": memory.updated_at.isoformat()}


class ProposedChange(db.Model):
    """One merge, rewrite or delete of a proposal, with the memories it depends on as they were then."""

    __tablename__ = "proposed_changes"

    id: Mapped[int] = mapped_column(primary_key=True)
    proposal_id: Mapped[int] = mapped_column(
        sa.ForeignKey("memory_proposals.id", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(default=0)
    kind: Mapped[str] = mapped_column(
        sa.Enum(*CHANGE_KINDS, name="proposed_change_kind", native_enum=False, create_constraint=True)
    )
    memory_ids: Mapped[list[int]] = mapped_column(JSON)  # the memories it changes, in the order given
    # Every memory it depends on (those it changes, and the copy a duplicate's removal keeps), by id: its
    # snapshot and updated_at when proposed.
    snapshots: Mapped[dict[str, dict[str, Any]]] = mapped_column(JSON)
    content: Mapped[str | None] = mapped_column(sa.Text)  # the merged or rewritten text
    # Set when this delete removes an exact copy of that memory (dedup), which stays.
    duplicate_of: Mapped[int | None] = mapped_column(sa.ForeignKey("agent_memories.id"))
    tokens_before: Mapped[int]  # of the memories it changes
    tokens_after: Mapped[int]  # of what it leaves: the new text, or nothing
    status: Mapped[str] = mapped_column(
        sa.Enum(*CHANGE_STATUSES, name="proposed_change_status", native_enum=False, create_constraint=True),
        default="pending",
    )
    stale_reason: Mapped[str | None] = mapped_column(sa.Text)  # what made it stale

    proposal: Mapped["MemoryProposal"] = relationship(back_populates="changes")  # noqa: F821 (models/proposals.py)

    @classmethod
    def build(
        cls,
        kind: str,
        memories: list[AgentMemory],
        content: str | None = None,
        *,
        duplicate_of: AgentMemory | None = None,
    ) -> "ProposedChange":
        """A change of these memories, not yet part of a proposal (ValueError for text no memory may have)."""
        content = checked_content(content) if kind != "delete" else None
        depends = [*memories, *([duplicate_of] if duplicate_of else [])]
        return cls(
            kind=kind,
            memory_ids=[m.id for m in memories],
            snapshots={str(m.id): _version(m) for m in depends},
            content=content,
            duplicate_of=duplicate_of.id if duplicate_of else None,
            tokens_before=sum(m.token_estimate or 0 for m in memories),
            tokens_after=count_tokens(content) if content else 0,
            status="pending",
        )

    @property
    def saves(self) -> int:
        """Core tokens it takes away when applied."""
        return self.tokens_before - self.tokens_after

    @property
    def mutations(self) -> int:
        """What it counts against a session's cap: each memory it changes (a duplicate's removal: nothing)."""
        return 0 if self.duplicate_of else len(self.memory_ids)

    def before(self, memory_id: int) -> dict[str, Any]:
        """A memory it changes, as it was when proposed."""
        return self.snapshots[str(memory_id)]

    def problem(self, memories: dict[int, AgentMemory], since: dict[int, str]) -> str | None:
        """Why it cannot be applied to the memory as it is now (`memories` by id, `since`: what happened to
        them); None when every memory it depends on is exactly as it was."""
        for key, then in self.snapshots.items():
            memory = memories.get(int(key))
            if memory is None:
                return f"Memory #{key} no longer exists."
            if memory.updated_at.isoformat() != then["updated_at"] or not memory.matches_snapshot(then):
                return f"Memory #{key} was {since.get(memory.id, 'changed')} since this change was proposed."
        targets = [memories[i] for i in self.memory_ids]
        if self.kind == "merge" and not all(same_audience(targets[0], m) for m in targets[1:]):
            return "Its memories are no longer heard by the same people."
        return None

    def apply(self, agent: Agent, memories: dict[int, AgentMemory], **audit: Any) -> None:
        """Make the change (after problem() found none), audited with `audit` (session, person, proposal)."""
        targets = [memories[i] for i in self.memory_ids]
        if self.kind == "merge":
            merge(agent, targets, self.content, **audit)
        elif self.kind == "rewrite":
            rewrite(targets[0], self.content, **audit)
        else:
            action = "memory_dedup" if self.duplicate_of else "memory_refinement_delete"
            remove(targets, action=action, **audit)

    def repeats(self, kind: str, memories: list[AgentMemory], content: str | None) -> bool:
        """True when this rejected change is proposed again unchanged: the same kind, memories and text, and
        the memories still as they were when a person rejected it."""
        if self.status != "rejected" or kind != self.kind:
            return False
        if sorted(m.id for m in memories) != sorted(self.memory_ids):
            return False
        if kind != "delete" and content_hash_of(content or "") != content_hash_of(self.content or ""):
            return False
        return all(m.matches_snapshot(self.before(m.id)) for m in memories)
