"""Which of an agent's memories fit a token budget: the prompt's memory (memories_within: constitutional, then
those that match the conversation, then core oldest first and the week's journal newest first), and pages of
memories for a session or a reflection (token_pages). Each listed memory costs its tokens and LINE_TOKENS."""

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models.access import memories_heard_from
from webapp.models.memories import JOURNAL_WINDOW, AgentMemory, active_memories, prompt_memories
from webapp.search.databases import backend

# What a listed memory costs beyond its own tokens: the bullet, the date and the line break.
LINE_TOKENS = 8


@dataclass
class MemoryWithin:
    """The memories that fit a prompt's memory budget, in the order they were chosen: the constitutional
    memories (first in `core`), those that match the conversation (`relevant`, best first, faded journal
    included), then core memories oldest first and the week's journal newest first; and how many of the
    agent's core memories and of the week's journal entries are not listed."""

    core: list["AgentMemory"] = field(default_factory=list)
    journal: list["AgentMemory"] = field(default_factory=list)
    relevant: list["AgentMemory"] = field(default_factory=list)
    core_total: int = 0
    journal_total: int = 0  # of the last 7 days
    now: datetime | None = None

    @property
    def listed(self) -> list["AgentMemory"]:
        """Every memory listed, in the order a prompt (and the memory page) shows them."""
        return self.relevant + self.core + self.journal

    @property
    def ids(self) -> list[int]:
        return [m.id for m in self.listed]

    @property
    def core_left_out(self) -> int:
        return self.core_total - sum(m.memory_type == "core" for m in self.listed)

    @property
    def journal_left_out(self) -> int:
        in_week = sum(m.in_journal_window(self.now) for m in self.listed) if self.journal_total else 0
        return self.journal_total - in_week

    @property
    def left_out(self) -> int:
        return self.core_left_out + self.journal_left_out

    def shown_as(self, visibility: str) -> "MemoryWithin":
        """What someone may see of it: everything ("prompt"), the core memories only ("core"), or nothing."""
        if visibility == "prompt":
            return self
        if visibility == "core":
            relevant = [m for m in self.relevant if m.memory_type == "core"]
            return MemoryWithin(core=self.core, relevant=relevant, core_total=self.core_total, now=self.now)
        return MemoryWithin()

    def drop_last(self) -> None:
        """Leave out the memory chosen last: the oldest journal entry listed, else the newest core memory, else
        the weakest match, else the newest constitutional memory."""
        if self.journal:
            self.journal.pop()
        elif self.core and not self.core[-1].constitutional:
            self.core.pop()
        elif self.relevant:
            self.relevant.pop()
        elif self.core:
            self.core.pop()


def memories_within(
    agent_id: int,
    now: datetime,
    budget: int,
    relevant: Sequence[int] = (),
    *,
    heard_chats: Sequence[int],
) -> MemoryWithin:
    """The memories that fit `budget`, chosen in this order while their tokens fit: the constitutional memories,
    the `relevant` ones (ids of any active memory of the agent, best first), then core memories oldest first and
    the week's journal newest first. No memory is listed twice.

    Only the memories heard where they are for are candidates or counted, inside the queries, so the budget is
    never filled with memories that may not be used there: those for everyone, and those from `heard_chats`
    (webapp.models.access.memory_chats_heard: the chats of the agent's memories that may be heard there).

    One statement whatever the number of memories: a running sum (a window function) over the few rows that
    could fit picks those that do, each row carrying how many core memories and journal entries of the week
    there are (counted once, a subquery of one row joined to them); a second only when none fits. Both are built
    once (for each number of relevant memories) and given their values when run: built at each call, building
    and keying them took longer than running them (with 200 memories on PostgreSQL, 10 ms a call against 4 to 6;
    bench.job_overhead --memories 200, "memories within budget": 10 to 12 ms against 6).
    """
    relevant = list(relevant)
    values = {
        "agent_id": agent_id,
        "journal_since": now - JOURNAL_WINDOW,
        "budget": budget,
        "cap": budget // LINE_TOKENS + 1,  # every listed memory costs more than LINE_TOKENS
        "heard_chats": list(heard_chats),
        **{f"relevant_{rank}": memory_id for rank, memory_id in enumerate(relevant)},
    }
    fitting_query, counts_query = _within_queries(len(relevant), db.engine.dialect.name)
    rows = db.session.execute(fitting_query, values).all()
    fitting = [row[0] for row in rows]
    totals = rows[0][1:] if rows else db.session.execute(counts_query, values).one()
    found = set(relevant)
    # A constitutional memory is listed with the core memories, whatever its type: it never fades.
    permanent = {m.id for m in fitting if m.constitutional or (m.memory_type == "core" and m.id not in found)}
    return MemoryWithin(
        core=[m for m in fitting if m.id in permanent],
        journal=[m for m in fitting if m.id not in permanent and m.id not in found],
        relevant=[m for m in fitting if m.id in found and m.id not in permanent],
        core_total=int(totals[1]),
        journal_total=int(totals[0]) - int(totals[1]),
        now=now,
    )


@functools.cache
def _within_queries(relevant_count: int, database: str) -> tuple[sa.Select, sa.Select]:
    """memories_within's two statements for this many relevant memories, every value a bound parameter (the
    heard chats as one, so the statement's text is the same for any number of them); for each database, as
    each binds a list its own way (webapp.search.databases)."""
    relevant = [sa.bindparam(f"relevant_{rank}") for rank in range(relevant_count)]
    is_core = AgentMemory.memory_type == "core"
    is_relevant = AgentMemory.id.in_(relevant) if relevant else sa.false()
    journal_since = sa.bindparam("journal_since", type_=AgentMemory.created_at.type)
    tokens = sa.func.coalesce(AgentMemory.token_estimate, sa.func.length(AgentMemory.content)) + LINE_TOKENS
    order = (
        sa.case((AgentMemory.constitutional, 0), (is_relevant, 1), (is_core, 2), else_=3),
        sa.case((AgentMemory.constitutional, AgentMemory.created_at)),
        sa.case(*((AgentMemory.id == memory_id, rank) for rank, memory_id in enumerate(relevant)))
        if relevant
        else sa.null(),
        sa.case((is_core, AgentMemory.created_at)),
        sa.case((AgentMemory.memory_type == "journal", AgentMemory.created_at)).desc(),
        sa.case((is_core, AgentMemory.id), else_=-AgentMemory.id),
    )
    cap = sa.bindparam("cap")
    heard = memories_heard_from(backend().among(AgentMemory.chat_id, "heard_chats"))
    # A constitutional or relevant memory among the oldest core or newest journal is listed once, in its place.
    agent_id = sa.bindparam("agent_id")
    scope = active_memories(agent_id).where(heard).with_only_columns(AgentMemory.id)
    listable = prompt_memories(agent_id, journal_since).where(heard).with_only_columns(AgentMemory.id)
    journal = listable.where(AgentMemory.memory_type == "journal")
    parts = [
        scope.where(AgentMemory.constitutional).order_by(AgentMemory.created_at, AgentMemory.id).limit(cap),
        scope.where(is_relevant),
        listable.where(is_core).order_by(AgentMemory.created_at, AgentMemory.id).limit(cap),
        journal.order_by(AgentMemory.created_at.desc(), AgentMemory.id.desc()).limit(cap),
    ]
    candidates = sa.union_all(*(part.subquery().select() for part in parts)).subquery()
    ranked = (
        sa.select(AgentMemory.id, sa.func.sum(tokens).over(order_by=order).label("running"))
        .where(AgentMemory.id.in_(sa.select(candidates.c.id)))
        .subquery()
    )
    counts = listable.with_only_columns(
        sa.func.count().label("listable"),
        sa.func.coalesce(sa.func.sum(sa.case((is_core, 1), else_=0)), 0).label("core"),
    )
    counted = counts.subquery("counted")
    fitting = (
        sa.select(AgentMemory, counted.c.listable, counted.c.core)
        .join(ranked, ranked.c.id == AgentMemory.id)
        .join(counted, sa.true())
        .where(ranked.c.running <= sa.bindparam("budget"))
        .order_by(ranked.c.running)
    )
    return fitting, counts


def token_pages(memories: list["AgentMemory"], budget: int) -> list[list["AgentMemory"]]:
    """The memories split, in order, into pages whose tokens each fit `budget` (a page holds one at least)."""
    pages: list[list[AgentMemory]] = []
    used = budget + 1
    for memory in memories:
        tokens = (memory.token_estimate or len(memory.content)) + LINE_TOKENS
        if used + tokens > budget:
            pages.append([])
            used = 0
        pages[-1].append(memory)
        used += tokens
    return pages
