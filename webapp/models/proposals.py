"""Proposals (issue 23): the merges, rewrites and deletes a refinement session decided for an agent whose
background changes are staged, kept until an admin approves all, some or none of them in one decision.

A staged session applies nothing: each change it decides is kept with the memories it depends on as they were
then (their snapshots and updated_at). Approval applies the chosen changes in one transaction, each rechecked
first: a change whose memory was edited, deleted or restored since is stale and not applied; the session's floor
and cap hold for what is applied. Applied changes are audited as the session's own, with the approving person,
so they can be undone like any other. Rejected and stale changes are listed in later sessions' prompts, and a
rejected change is refused if proposed again unchanged. A pending proposal expires after PROPOSAL_EXPIRY_DAYS
(it is kept, for the audit): queries compare expires_at with the time, so it stops counting at once, and its
status is written by the next refinement of its agent, the weekly finder or `flask memories proposals`.

The verbs a refinement session changes memory with (merge, rewrite, remove) live here too: a session applies
them at once when its agent's changes apply automatically, and approval applies a proposal's changes with them.
"""

from collections import Counter
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from flask import current_app
from sqlalchemy.orm import Mapped, contains_eager, mapped_column, relationship

from webapp.extensions import JSON, db
from webapp.models.access import same_audience
from webapp.models.accounts import User
from webapp.models.agents import Agent
from webapp.models.audit import AuditLog, record_change
from webapp.models.drift import drift_of
from webapp.models.memories import (
    AgentMemory,
    add_sources,
    checked_content,
    content_hash_of,
    core_token_usage,
    source_ids,
)
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens

PROPOSAL_STATUSES = ("pending", "decided", "expired")
CHANGE_KINDS = ("merge", "rewrite", "delete")
CHANGE_STATUSES = ("pending", "applied", "rejected", "stale")
STAGED_BECAUSE = ("setting", "drift")
REFUSED_LISTED = 20  # the refused changes a session's prompt lists at most, newest first
REFUSED_WITHIN = timedelta(days=90)
# What happened to a memory since a change was proposed, in words, by the audit row that did it.
SINCE = {
    "memory_update": "edited",
    "memory_delete": "deleted",
    "memory_restore": "restored",
    "memory_constitutional_toggle": "protected or unprotected",
    "memory_audience": "given another audience",
    "memory_promote": "promoted",
    "memory_dedup": "removed as a duplicate",
    "memory_undo": "changed by an undo",
    "memory_rollback": "rolled back",
}


class ProposalRefused(ValueError):
    """The decision cannot be made as asked: nothing of it is applied (the caller rolls back)."""


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


def _version(memory: AgentMemory) -> dict[str, Any]:
    """A memory as a change depends on it: its snapshot, and when it last changed in any way."""
    return {**memory.snapshot(), "updated_at": memory.updated_at.isoformat()}


class MemoryProposal(db.Model):
    """The changes one staged refinement session proposed, decided together."""

    __tablename__ = "memory_proposals"
    __table_args__ = (
        sa.Index("ix_memory_proposals_account_id_status", "account_id", "status"),
        sa.Index("ix_memory_proposals_agent_id_status", "agent_id", "status"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"))
    agent_id: Mapped[int] = mapped_column(sa.ForeignKey("agents.id"))
    session_id: Mapped[str] = mapped_column(sa.String(36), unique=True)
    status: Mapped[str] = mapped_column(
        sa.Enum(*PROPOSAL_STATUSES, name="proposal_status", native_enum=False, create_constraint=True),
        default="pending",
    )
    # The agent's own setting, or the drift alarm overriding "automatic" (then `reason` says why).
    staged_because: Mapped[str] = mapped_column(
        sa.Enum(*STAGED_BECAUSE, name="proposal_staged_because", native_enum=False, create_constraint=True)
    )
    reason: Mapped[str | None] = mapped_column(sa.Text)
    summary: Mapped[str | None] = mapped_column(sa.Text)  # the session's own, from its complete call
    tokens_before: Mapped[int]  # core tokens when it was proposed
    tokens_after: Mapped[int]  # core tokens had every change been applied then
    budget: Mapped[int]  # the agent's core token budget then
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime]
    decided_at: Mapped[datetime | None]
    decided_by_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("users.id")
    )  # None: from the command line

    agent: Mapped[Agent] = relationship()
    decided_by: Mapped[User | None] = relationship()
    changes: Mapped[list["ProposedChange"]] = relationship(
        back_populates="proposal", order_by="ProposedChange.position", cascade="all, delete-orphan"
    )

    @classmethod
    def stage(
        cls,
        agent: Agent,
        session_id: str,
        changes: list["ProposedChange"],
        *,
        staged_because: str,
        reason: str | None,
        summary: str | None,
        expiry: timedelta,
    ) -> "MemoryProposal":
        """Add (flushed, not committed) the proposal of a session's changes, to expire after `expiry`."""
        usage, now = core_token_usage(agent.id), utcnow()
        for position, change in enumerate(changes):
            change.position = position
        proposal = cls(
            account_id=agent.account_id,
            agent=agent,
            session_id=session_id,
            staged_because=staged_because,
            reason=reason,
            summary=summary,
            tokens_before=usage,
            tokens_after=usage - sum(change.saves for change in changes),
            budget=agent.core_token_budget,
            created_at=now,
            expires_at=now + expiry,
            changes=changes,
        )
        db.session.add(proposal)
        db.session.flush()
        return proposal

    def is_pending(self, now: datetime) -> bool:
        return self.status == "pending" and self.expires_at > now

    def status_at(self, now: datetime) -> str:
        """Its status, counting one past its expiry as expired before that is written."""
        return "expired" if self.status == "pending" and self.expires_at <= now else self.status

    def memories(self, *, lock: bool = False) -> dict[int, AgentMemory]:
        """The memories its changes depend on, as they are now (one query; locked for an approval)."""
        ids = {int(key) for change in self.changes for key in change.snapshots}
        query = sa.select(AgentMemory).where(AgentMemory.id.in_(ids), AgentMemory.agent_id == self.agent_id)
        if lock:
            query = query.with_for_update()
        return {m.id: m for m in db.session.scalars(query.execution_options(populate_existing=True))}

    def since(self) -> dict[int, str]:
        """What last happened to each of its memories since it was proposed, in words (one query)."""
        ids = {int(key) for change in self.changes for key in change.snapshots}
        rows = db.session.execute(
            sa.select(AuditLog.auditable_id, AuditLog.action)
            .where(AuditLog.auditable_type == "AgentMemory", AuditLog.auditable_id.in_(ids))
            .where(AuditLog.created_at >= self.created_at)
            .order_by(AuditLog.id)
        )
        return {memory_id: _since_words(action) for memory_id, action in rows}

    def problems(self) -> dict[int, str | None]:
        """Each change's reason not to apply it as the memory is now (None: it still applies)."""
        memories, since = self.memories(), self.since()
        return {change.id: change.problem(memories, since) for change in self.changes}

    def decide(
        self,
        apply: Collection[int],
        *,
        user_id: int | None,
        via: str,
        max_mutations: int,
        floor: float,
        now: datetime,
    ) -> dict[str, int]:
        """Apply the changes whose ids are in `apply` that still apply, reject the others; add, not commit.

        Raises ProposalRefused when it is not pending, or when what would be applied breaks the session's cap
        or floor; the caller then rolls back, and nothing of the decision is kept."""
        if not self.is_pending(now):
            raise ProposalRefused(f"This proposal is {self.status_at(now)}; it can no longer be decided.")
        claimed = db.session.execute(
            sa.update(MemoryProposal)
            .where(MemoryProposal.id == self.id, MemoryProposal.status == "pending")
            .values(status="decided", decided_at=now, decided_by_id=user_id)
            .execution_options(synchronize_session=False)
        ).rowcount  # written first: a second decision waits for this one, then finds nothing to claim
        if claimed != 1:
            raise ProposalRefused("This proposal was decided meanwhile.")
        self.status, self.decided_at, self.decided_by_id = "decided", now, user_id
        memories, since = self.memories(lock=True), self.since()
        for change in self.changes:
            change.stale_reason = change.problem(memories, since)
            chosen = "applied" if change.id in apply else "rejected"
            change.status = "stale" if change.stale_reason else chosen
        applying = [change for change in self.changes if change.status == "applied"]
        before = core_token_usage(self.agent_id)
        self._check_limits(applying, before, max_mutations, floor)
        audit = dict(via=via, session_id=self.session_id, user_id=user_id, proposal_id=self.id)
        for change in applying:
            change.apply(self.agent, memories, change_id=change.id, **audit)
        counts = Counter(change.status for change in self.changes)
        outcome = {status: counts[status] for status in ("applied", "rejected", "stale")}
        AuditLog.record(
            "memory_proposal_decided",
            self.agent,
            account_id=self.account_id,
            agent_id=self.agent_id,
            tokens_before=before,
            tokens_after=core_token_usage(self.agent_id),
            **audit,
            **outcome,
        )
        return outcome

    @staticmethod
    def _check_limits(
        applying: list["ProposedChange"], before: int, max_mutations: int, floor: float
    ) -> None:
        """The session's cap and floor, for what is about to be applied."""
        mutations = sum(change.mutations for change in applying)
        if mutations > max_mutations:
            raise ProposalRefused(
                f"These changes would change {mutations} memories; a session may change at most {max_mutations}. "
                "Tick fewer."
            )
        after = before - sum(change.saves for change in applying)
        if applying and after < floor * before:
            raise ProposalRefused(
                f"These changes would leave {after:,} core tokens, below {floor:.0%} of the {before:,} there are "
                "now. Tick fewer."
            )

    def expire(self, now: datetime) -> None:
        """Mark it expired (kept for the audit), with an audit row on its agent."""
        self.status = "expired"
        AuditLog.record(
            "memory_proposal_expired",
            self.agent,
            account_id=self.account_id,
            agent_id=self.agent_id,
            session_id=self.session_id,
            proposal_id=self.id,
            expires_at=self.expires_at.isoformat(),
        )


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

    proposal: Mapped[MemoryProposal] = relationship(back_populates="changes")

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


def _since_words(action: str) -> str:
    if action in SINCE:
        return SINCE[action]
    return "changed by refinement" if action.startswith("memory_refinement") else "changed"


def session_limits() -> dict[str, Any]:
    """The cap and floor of a refinement session (settings), which hold for what an approval applies too."""
    config = current_app.config
    return {"max_mutations": config["REFINEMENT_MAX_MUTATIONS"], "floor": config["REFINEMENT_TOKEN_FLOOR"]}


def outcome_words(outcome: dict[str, int]) -> str:
    """A decision's outcome in words: "Decided: 2 applied, 1 rejected."."""
    words = [f"{n} {status}" for status, n in outcome.items() if n]
    return "Decided: " + (", ".join(words) if words else "nothing to apply") + "."


def pending(now: datetime) -> sa.ColumnElement[bool]:
    """Condition on MemoryProposal: waiting for a decision, and not past its expiry."""
    return sa.and_(MemoryProposal.status == "pending", MemoryProposal.expires_at > now)


def pending_proposal(agent_id: Any, now: datetime) -> sa.Select:
    """The agent's pending proposal (there is one at most: no session starts while one waits)."""
    return sa.select(MemoryProposal).where(MemoryProposal.agent_id == agent_id, pending(now))


def expire_proposals(now: datetime, agent_id: int | None = None) -> int:
    """Mark the proposals past their expiry expired (of one agent, or all); added, not committed."""
    query = sa.select(MemoryProposal).where(
        MemoryProposal.status == "pending", MemoryProposal.expires_at <= now
    )
    if agent_id is not None:
        query = query.where(MemoryProposal.agent_id == agent_id)
    expired = db.session.scalars(query).all()
    for proposal in expired:
        proposal.expire(now)
    return len(expired)


def refused_changes(agent_id: int, now: datetime) -> list[ProposedChange]:
    """The agent's rejected and stale changes of the last 90 days, newest first: what its next session is told
    not to propose again unchanged."""
    return list(
        db.session.scalars(
            sa.select(ProposedChange)
            .join(MemoryProposal, MemoryProposal.id == ProposedChange.proposal_id)
            .where(MemoryProposal.agent_id == agent_id, ProposedChange.status.in_(("rejected", "stale")))
            .where(MemoryProposal.decided_at >= now - REFUSED_WITHIN)
            .order_by(MemoryProposal.decided_at.desc(), ProposedChange.position)
            .limit(REFUSED_LISTED)
            .options(contains_eager(ProposedChange.proposal))
        )
    )


def staging(agent: Agent, now: datetime, threshold: float) -> tuple[str, str | None] | None:
    """Why the agent's background merges, rewrites and deletes are staged now: ("setting", None), ("drift",
    the alarm's reason), or None when they apply at once."""
    if agent.background_changes == "staged":
        return "setting", None
    drift = drift_of(agent.id, now, threshold)
    return ("drift", drift.reason) if drift.alarm else None


def pending_count(account_id: int, now: datetime) -> tuple[int, int | None]:
    """How many proposals of the account wait for review, and the id of the oldest (one query)."""
    count, first = db.session.execute(
        sa.select(sa.func.count(), sa.func.min(MemoryProposal.id)).where(
            MemoryProposal.account_id == account_id, pending(now)
        )
    ).one()
    return int(count), first
