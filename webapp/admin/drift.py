"""The ledger's drift chart: an agent's core memory over time (webapp.models.drift) drawn as inline SVG by the
server, no script: its tokens against the budget in one band, its count in a band below, and the changes that
moved it marked by kind in lanes under both. Its words (title, description, legend) are HTML and SVG text a screen
reader reads; the drawing itself carries no text, so it scales to a phone."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar

from flask import current_app

from webapp.extensions import db
from webapp.models import Agent
from webapp.models.drift import DRIFT_WINDOW, History, Mark, core_history, drift_of
from webapp.models.proposals import pending_proposal
from webapp.timeutil import utcnow

CHART_DAYS = 90
WIDTH = 640
TOKENS_BAND, COUNT_BAND = (6, 66), (80, 114)  # (top, bottom) of each band
LANE_TOP, LANE_HEIGHT = 124, 9
KINDS = {  # kind: (its lane, how the legend names it)
    "added": (0, "added"),
    "merged": (1, "merged"),
    "rewritten": (2, "rewritten"),
    "deleted": (3, "deleted"),
    "undone": (4, "undone or restored"),
    "changed": (4, "other"),
}
HEIGHT = LANE_TOP + LANE_HEIGHT * 5


@dataclass
class Chart:
    history: History
    budget: int
    width: ClassVar[int] = WIDTH
    height: ClassVar[int] = HEIGHT
    tokens_band: ClassVar[tuple[int, int]] = TOKENS_BAND
    count_band: ClassVar[tuple[int, int]] = COUNT_BAND

    @property
    def top_tokens(self) -> int:
        return max([self.budget, *(p.tokens for p in self.history.points)]) or 1

    @property
    def top_count(self) -> int:
        return max([*(p.count for p in self.history.points), 1])

    def x(self, at: datetime) -> float:
        span = (self.history.now - self.history.since).total_seconds() or 1
        return round(WIDTH * (at - self.history.since).total_seconds() / span, 1)

    @staticmethod
    def _y(value: int, top: int, band: tuple[int, int]) -> float:
        return round(band[1] - (band[1] - band[0]) * value / top, 1)

    def _path(self, values: list[tuple[datetime, int]], top: int, band: tuple[int, int]) -> str:
        return "M" + " L".join(f"{self.x(at)} {self._y(value, top, band)}" for at, value in values)

    @property
    def tokens_path(self) -> str:
        return self._path([(p.at, p.tokens) for p in self.history.points], self.top_tokens, TOKENS_BAND)

    @property
    def count_path(self) -> str:
        return self._path([(p.at, p.count) for p in self.history.points], self.top_count, COUNT_BAND)

    @property
    def budget_y(self) -> float:
        return self._y(self.budget, self.top_tokens, TOKENS_BAND)

    @property
    def window_x(self) -> float:
        """Where the drift alarm's 30 days begin."""
        return max(self.x(self.history.now - DRIFT_WINDOW), 0)

    def mark_at(self, mark: Mark) -> tuple[float, float]:
        """The centre of a mark: the middle of its stretch of time across, its kind's lane down."""
        lane = KINDS.get(mark.kind, KINDS["changed"])[0]
        across = self.x(mark.at + self.history.bucket / 2)
        return max(min(across, WIDTH - 5), 5), LANE_TOP + LANE_HEIGHT * lane + LANE_HEIGHT / 2

    def mark_title(self, mark: Mark) -> str:
        """When a mark's changes were made, in words (UTC): its day, or its stretch of a day."""
        when = f"on {mark.at:%Y-%m-%d}"
        if self.history.bucket < timedelta(days=1):
            when += f", {mark.at:%H:%M}–{mark.at + self.history.bucket:%H:%M} UTC"
        return f"{mark.changes} {mark.kind} {when}"

    @property
    def young(self) -> bool:
        """The agent is younger than the chart's days: the chart starts at its first memory."""
        return self.history.young

    @property
    def dates(self) -> list[tuple[float, str]]:
        """The dates under the chart, as (percent across, words): where it starts, its middle, and now; with the
        time of day when it spans less than two days."""
        since, now = self.history.since, self.history.now
        middle = since + (now - since) / 2
        if now - since >= timedelta(days=2):
            return [(0, f"{since:%Y-%m-%d}"), (50, f"{middle:%Y-%m-%d}"), (100, "now")]
        return [(0, f"{since:%Y-%m-%d %H:%M}"), (50, f"{middle:%H:%M}"), (100, "now")]

    @property
    def legend(self) -> list[tuple[str, str, int]]:
        """(kind, its name, how many changes) for each kind the chart shows."""
        counted = self.history.kinds
        return [(kind, KINDS.get(kind, KINDS["changed"])[1], counted[kind]) for kind in counted]

    @property
    def heading(self) -> str:
        if self.young:
            return f"Core memory since its first memory ({self.history.since:%Y-%m-%d})"
        return f"Core memory, last {CHART_DAYS} days"

    @property
    def description(self) -> str:
        """The chart in words."""
        first, last = self.history.points[0], self.history.points[-1]
        changes = ", ".join(f"{n} {name}" for _kind, name, n in self.legend) or "no changes"
        return (
            f"Core memory from {self.dates[0][1]}: {first.count} memories, {first.tokens:,} tokens; now "
            f"{last.count} memories, {last.tokens:,} tokens (budget {self.budget:,}). Changes that moved it: "
            f"{changes}."
        )


def drift_context(agent: Agent) -> dict[str, Any]:
    """What the ledger shows of drift and review: the alarm, the chart, the proposal waiting (five queries)."""
    now = utcnow()
    return {
        "drift": drift_of(agent.id, now, current_app.config["DRIFT_ALARM_SHARE"]),
        "chart": Chart(core_history(agent.id, now, CHART_DAYS), agent.core_token_budget),
        "chart_days": CHART_DAYS,
        "waiting": db.session.scalar(pending_proposal(agent.id, now)),
    }
