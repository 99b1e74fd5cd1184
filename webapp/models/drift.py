"""Drift: an agent's core memory over time, read back from its audit trail, and the alarm that raises a hand when
refinement's unreviewed changes have removed too much of it (issue 23).

Every change to a memory has an audit row with the memory's state before and after it. Walking those rows back
from the core memory as it stands gives its count and tokens at each change (the ledger's chart). The alarm
counts what refinement removed on its own in the last 30 days: merges, rewrites and deletes applied with no
person's review, net of any undo or rollback of them since. A person's own edits, approved proposals and the
removal of exact copies (dedup: nothing is lost) do not count.
"""

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import groupby
from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models.audit import AuditLog
from webapp.models.memories import AgentMemory
from webapp.tokens import count_tokens

DRIFT_WINDOW = timedelta(days=30)
UNREVIEWED = (
    "memory_refinement_consolidate",
    "memory_refinement_consolidate_create",
    "memory_refinement_update",
    "memory_refinement_delete",
)
UNDOING = ("memory_undo", "memory_rollback")
# What moved the core memory, as the chart marks it.
KIND_OF = {
    "memory_create": "added",
    "memory_promote": "added",
    "memory_restore": "added",
    "memory_refinement_consolidate_create": "merged",
    "memory_refinement_consolidate": "merged",
    "memory_refinement_update": "rewritten",
    "memory_update": "rewritten",
    "memory_refinement_delete": "deleted",
    "memory_delete": "deleted",
    "memory_dedup": "deleted",
    "memory_undo": "undone",
    "memory_rollback": "undone",
}
HISTORY_ROWS = (
    2000  # the chart reads at most this many changes back (an agent that saves all day starts later)
)


class _Tokens(dict):
    """Tokens of each content met while reading rows, counted once."""

    def __missing__(self, content: str) -> int:
        self[content] = count_tokens(content)
        return self[content]


def _core(snapshot: dict[str, Any] | None, tokens: _Tokens) -> tuple[int, int]:
    """(1, its tokens) when a snapshot is an active core memory, else (0, 0)."""
    if not snapshot or snapshot.get("memory_type") != "core" or snapshot.get("deleted_at"):
        return 0, 0
    return 1, tokens[snapshot["content"]]


def core_delta(row: AuditLog, tokens: _Tokens) -> tuple[int, int]:
    """How a change moved the core memory: (memories, tokens) after less before."""
    before, after = _core(row.data.get("before"), tokens), _core(row.data.get("after"), tokens)
    return after[0] - before[0], after[1] - before[1]


def core_totals(agent_ids: Iterable[int]) -> dict[int, tuple[int, int]]:
    """(count, tokens) of each agent's active core memories now: one query."""
    ids = list(agent_ids)
    rows = db.session.execute(
        sa.select(
            AgentMemory.agent_id,
            sa.func.count(),
            sa.func.coalesce(sa.func.sum(AgentMemory.token_estimate), 0),
        )
        .where(AgentMemory.agent_id.in_(ids), AgentMemory.is_active, AgentMemory.memory_type == "core")
        .group_by(AgentMemory.agent_id)
    )
    found = {agent_id: (int(count), int(tokens)) for agent_id, count, tokens in rows}
    return {agent_id: found.get(agent_id, (0, 0)) for agent_id in ids}


@dataclass
class Drift:
    """What unreviewed refinement removed from one agent's core memory in the last 30 days."""

    removed: int  # core tokens, net of undos (0 when it added more than it removed)
    tokens: int  # core tokens now
    threshold: float  # the share above which the alarm is on (DRIFT_ALARM_SHARE)

    @property
    def share(self) -> float:
        """The part of the core memory those changes found that they removed."""
        return self.removed / (self.tokens + self.removed) if self.removed else 0.0

    @property
    def alarm(self) -> bool:
        return self.share > self.threshold

    @property
    def reason(self) -> str:
        """Why further changes are staged, in words for an admin."""
        return (
            f"In the last {DRIFT_WINDOW.days} days, refinement applied on its own removed {self.share:.0%} of "
            f"core memory ({self.removed:,} of {self.tokens + self.removed:,} tokens), more than the "
            f"{self.threshold:.0%} allowed: every further merge, rewrite or delete is staged for review, "
            "whatever the agent's setting, until those changes are older than that."
        )


def drifts(agent_ids: Iterable[int], now: datetime, threshold: float) -> dict[int, Drift]:
    """The drift of each agent: two queries whatever the number of agents."""
    ids = list(agent_ids)
    rows = db.session.scalars(
        sa.select(AuditLog)
        .where(AuditLog.agent_id.in_(ids), AuditLog.auditable_type == "AgentMemory")
        .where(AuditLog.created_at >= now - DRIFT_WINDOW, AuditLog.action.in_(UNREVIEWED + UNDOING))
        .order_by(AuditLog.id)
    ).all()
    counted = {row.id for row in rows if row.action in UNREVIEWED and row.user_id is None}
    tokens, moved = _Tokens(), defaultdict(int)
    for row in rows:
        if row.id in counted or row.data.get("undo_of") in counted:
            moved[row.agent_id] += core_delta(row, tokens)[1]
    totals = core_totals(ids)
    return {agent_id: Drift(max(-moved[agent_id], 0), totals[agent_id][1], threshold) for agent_id in ids}


def drift_of(agent_id: int, now: datetime, threshold: float) -> Drift:
    return drifts([agent_id], now, threshold)[agent_id]


@dataclass
class Point:
    at: datetime
    count: int
    tokens: int


@dataclass
class Mark:
    """The changes of one kind in one stretch of time (`at` to `at` + History.bucket) that moved the core memory."""

    at: datetime
    kind: str
    changes: int


@dataclass
class History:
    """An agent's core memory from `since` to `now`: a step at each change, and the changes marked by kind in
    stretches of `bucket` (a day for a long history; minutes or hours for a young agent's)."""

    since: datetime
    now: datetime
    points: list[Point] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    bucket: timedelta = timedelta(days=1)
    young: bool = False  # the agent is younger than the days asked: it starts just before its first memory

    @property
    def kinds(self) -> Counter:
        counted: Counter = Counter()
        for mark in self.marks:
            counted[mark.kind] += mark.changes
        return counted

    @property
    def empty(self) -> bool:
        """Nothing to draw: no core memory in these days, and no change that moved it."""
        return not self.marks and not any(p.count or p.tokens for p in self.points)


# The stretches a chart's marks are counted in: the shortest that cuts the history into at most MARKS_ACROSS.
BUCKETS = [timedelta(minutes=m) for m in (1, 5, 15, 60, 180, 360, 720)] + [timedelta(days=1)]
MARKS_ACROSS = 90
EPOCH = datetime(2000, 1, 1)  # a Saturday at midnight: stretches start on the hour, or at midnight (UTC)


def _bucket_for(span: timedelta) -> timedelta:
    return next((b for b in BUCKETS if span / b <= MARKS_ACROSS), BUCKETS[-1])


def _start_of(at: datetime, bucket: timedelta) -> datetime:
    return EPOCH + (at - EPOCH) // bucket * bucket


def history_start(agent_id: int, now: datetime, days: int) -> datetime:
    """Where an agent's chart begins: `days` ago, or a little before its first memory when it is younger (so the
    first change is drawn, not stacked at the edge), one query."""
    since = now - timedelta(days=days)
    first = db.session.scalar(
        sa.select(sa.func.min(AgentMemory.created_at)).where(AgentMemory.agent_id == agent_id)
    )
    if first is None or first <= since:
        return since
    lead = max((now - first) / 20, timedelta(minutes=2))
    return max(first.replace(second=0, microsecond=0) - lead, since)


def core_history(agent_id: int, now: datetime, days: int) -> History:
    """The agent's core memory over the last `days` days, or since its first memory if it is younger, from its
    audit rows read newest first (three queries).

    The rows of one minute make one step: a merge's new memory and the parts it replaced (or an approval's
    changes) land together, so no passing state of a single change is drawn."""
    since = history_start(agent_id, now, days)
    bucket = _bucket_for(now - since)
    rows = db.session.scalars(
        sa.select(AuditLog)
        .where(AuditLog.agent_id == agent_id, AuditLog.auditable_type == "AgentMemory")
        .where(AuditLog.created_at >= since)
        .order_by(AuditLog.created_at.desc(), AuditLog.id.desc())
        .limit(HISTORY_ROWS)
    ).all()
    count, tokens = core_totals([agent_id])[agent_id]
    young = since > now - timedelta(days=days)
    history, counter, seen = History(since, now, bucket=bucket, young=young), _Tokens(), Counter()
    history.points.append(Point(now, count, tokens))
    for minute, group in groupby(rows, key=lambda row: row.created_at.replace(second=0, microsecond=0)):
        moves = [(row, core_delta(row, counter)) for row in group]
        moved_count, moved_tokens = (sum(move[i] for _row, move in moves) for i in (0, 1))
        for row, move in moves:
            if (
                any(move) and row.action != "memory_refinement_consolidate"
            ):  # a merge counts once, by its new memory
                seen[(_start_of(row.created_at, bucket), KIND_OF.get(row.action, "changed"))] += 1
        if not (moved_count or moved_tokens):
            continue
        history.points.append(Point(max(minute, since), count, tokens))
        count, tokens = max(count - moved_count, 0), max(tokens - moved_tokens, 0)
        history.points.append(Point(max(minute, since), count, tokens))
    if len(rows) == HISTORY_ROWS:
        history.since = rows[-1].created_at
    history.points.append(Point(history.since, count, tokens))
    history.points.reverse()
    history.marks = [Mark(at, kind, n) for (at, kind), n in sorted(seen.items())]
    return history
