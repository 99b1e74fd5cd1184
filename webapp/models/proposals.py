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

The verbs that change memory, and whether a session's changes are staged, are webapp.models.memory_changes.
"""

from collections import Counter
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, contains_eager, mapped_column, relationship

from webapp.extensions import db
from webapp.models.accounts import User
from webapp.models.agents import Agent
from webapp.models.audit import AuditLog
from webapp.models.memories import (
    AgentMemory,
    core_token_usage,
)
from webapp.models.memory_changes import ProposedChange
from webapp.timeutil import utcnow

PROPOSAL_STATUSES = ("pending", "decided", "expired")
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


def _since_words(action: str) -> str:
    if action in SINCE:
        return SINCE[action]
    return "changed by refinement" if action.startswith("memory_refinement") else "changed"


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


def pending_count(account_id: int, now: datetime) -> tuple[int, int | None]:
    """How many proposals of the account wait for review, and the id of the oldest (one query)."""
    count, first = db.session.execute(
        sa.select(sa.func.count(), sa.func.min(MemoryProposal.id)).where(
            MemoryProposal.account_id == account_id, pending(now)
        )
    ).one()
    return int(count), first
