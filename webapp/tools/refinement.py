"""A refinement session (spec 002): what the refine_memory tool (refine_memory.py) acts on while an agent refines
its own core memory, its actions (page, search, consolidate, update, delete, protect, complete) and how the
session closes. Only the refinement job (webapp.jobs.refinement) runs one.

Safety the spec lacks (DESIGN.md 5.4): every audit row carries the session id; at most `max_mutations`
changes per session; after each change, if core tokens fall below `floor` times the session's starting
tokens, the whole session is rolled back from its audit rows and the model is told to stop.

Memories are heard by different people (webapp.models.access), and a session works within one audience at a
time (issue 31): the job runs it in passes, one per audience (`begin_pass`), and a pass lists, searches,
finds and changes only the memories of its audience, so the model never reads one audience's words while it
can write another's. A merged or rewritten memory keeps that audience, and so does the journal note that
closes a pass that changed something. The cap and the floor hold for the whole session, across its passes.

A staged session (issue 23: its agent's setting, or the drift alarm) applies no merge, rewrite or delete: each
becomes a proposed change of the memories as they stand, listed no more to the model, and the session closes
with a proposal (webapp.models.proposals) for an admin to decide. The cap counts proposed changes as applied
ones; the floor holds for what the proposal would leave. An automatic session turns staged as soon as the drift
alarm goes on. A change a person rejected is refused when the model proposes it again unchanged.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from webapp.extensions import db
from webapp.models import Agent, AgentMemory, AuditLog
from webapp.models.access import EVERYONE, Audience
from webapp.models.audit import record_change, roll_back_session
from webapp.models.memories import core_memories, core_token_usage, like_pattern
from webapp.models.memory_budget import token_pages
from webapp.models.memory_changes import ProposedChange, merge, remove, rewrite
from webapp.models.proposals import MemoryProposal
from webapp.timeutil import utcnow
from webapp.tools.refinement_results import (
    ACTIONS,
    constitutional_refusal,
    error_result,
    memory_summary,
    param_error,
    parse_ids,
    unlisted_refusal,
)

MUTATIONS = ("consolidate", "update", "delete", "protect")
VIA = "refinement"


@dataclass
class RefinementSession:
    agent: Agent
    session_id: str
    start_tokens: int
    max_mutations: int
    floor: float
    page_tokens: int  # how much memory one page (the prompt's listing, a page or a search) may show
    stats: dict[str, int] = field(
        default_factory=lambda: {"consolidated": 0, "updated": 0, "deleted": 0, "protected": 0}
    )
    status: str = "running"  # then: complete, rolled_back or incomplete
    # The pass now running (begin_pass): the only audience it reads or writes, how many passes come after it,
    # how many memories it changed at once, and whether its model called complete.
    audience: Audience = EVERYONE
    passes_after: int = 0
    pass_applied: int = 0
    pass_done: bool = False
    passes_begun: int = 0
    summaries: list[str] = field(default_factory=list)  # one for each pass that completed
    # Issue 23. staged: why its merges, rewrites and deletes are proposed, not applied ("setting" or "drift",
    # with the alarm's reason); None: they apply at once, until `drift_alarm` (asked after each) gives a reason.
    staged: tuple[str, str | None] | None = None
    drift_alarm: Callable[[], str | None] | None = None
    proposed: list[ProposedChange] = field(default_factory=list)
    refused: list[ProposedChange] = field(
        default_factory=list
    )  # rejected or stale before: not again unchanged
    proposal_expiry: timedelta = timedelta(days=14)  # PROPOSAL_EXPIRY_DAYS

    @property
    def finished(self) -> bool:
        return self.status != "running"

    @property
    def pass_over(self) -> bool:
        """The pass may take no more calls: its model called complete, or the session is over."""
        return self.finished or self.pass_done

    def begin_pass(self, audience: Audience, passes_after: int) -> None:
        """Start the pass over one audience's memories."""
        self.passes_begun += 1
        self.audience, self.passes_after = audience, passes_after
        self.pass_applied, self.pass_done = 0, False

    @property
    def mutations(self) -> int:
        """Memories changed so far: a delete or merge of 14 memories is 14 changes, not one call."""
        return sum(self.stats.values())

    def run(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Execute one tool call; errors come back as results the model can read."""
        if self.pass_over:
            return error_result("The session is over; no more changes are accepted.")
        action = str(arguments.get("action", ""))
        if action not in ACTIONS:
            return error_result(f"Invalid action '{action}'")
        params = {k: str(v) for k, v in arguments.items() if k != "action" and v is not None}
        try:
            if action in MUTATIONS and (refusal := self._over_cap(action, params)):
                return refusal
            result = getattr(self, f"_{action}")(**params)
        except (ValueError, TypeError) as error:  # bad parameters or content the model itself rejects
            db.session.rollback()
            return error_result(str(error))
        if action in MUTATIONS and result.get("type") != "error":
            return self._check_floor() or result
        return result

    def _over_cap(self, action: str, params: dict[str, str]) -> dict[str, Any] | None:
        """The refusal when the call would change more memories than the session has left; else None."""
        left = self.max_mutations - self.mutations
        listed = params.get("ids", "").strip() or params.get("id", "")
        wanted = len(set(parse_ids(listed))) if action in ("consolidate", "delete") else 1
        if wanted <= left:
            return None
        if left <= 0:
            return error_result(
                f"This session allows at most {self.max_mutations} changes; call complete now."
            )
        return error_result(
            f"This session allows at most {self.max_mutations} changes and {left} are left; this call would "
            f"change {wanted} memories. Change fewer, or call complete."
        )

    @property
    def touched(self) -> set[int]:
        """The memories that already have a proposed change: the session lists and changes them no more."""
        return {memory_id for change in self.proposed for memory_id in change.memory_ids}

    def _listed(self):
        """The core memories the model is shown: those of the pass's audience but the ones it has proposed
        changes to."""
        query = core_memories(self.agent.id).where(self.audience.holds())
        return query.where(AgentMemory.id.not_in(self.touched)) if self.touched else query

    def pages(self) -> list[list[AgentMemory]]:
        """The agent's core memories, oldest first, in pages within the page budget."""
        return token_pages(db.session.scalars(self._listed()).all(), self.page_tokens)

    def _page(self, page: str = "", **_: str) -> dict[str, Any]:
        if not page.strip().isdigit():
            return param_error("page", "page (a number)")
        pages, number = self.pages(), int(page)
        if not 1 <= number <= len(pages):
            return error_result(f"There are {len(pages)} pages; ask for a page from 1 to {len(pages)}.")
        return {
            "type": "page",
            "page": number,
            "pages": len(pages),
            "results": [memory_summary(m) for m in pages[number - 1]],
        }

    def _search(self, query: str = "", **_: str) -> dict[str, Any]:
        if not query.strip():
            return param_error("search", "query")
        found = db.session.scalars(
            self._listed().where(AgentMemory.content.ilike(like_pattern(query.strip()), escape="\\"))
        ).all()
        shown = token_pages(found, self.page_tokens)[:1]
        results = [memory_summary(m) for m in (shown[0] if shown else [])]
        result = {"type": "search_results", "query": query, "count": len(found), "results": results}
        if len(results) < len(found):
            result["note"] = (
                f"Only the first {len(results)} fit; search with more precise words for the others."
            )
        return result

    def _consolidate(self, ids: str = "", content: str = "", **_: str) -> dict[str, Any]:
        if not ids.strip():
            return param_error("consolidate", "ids")
        if not content.strip():
            return param_error("consolidate", "content")
        wanted = parse_ids(ids)
        memories = self._memories(wanted)
        if refusal := constitutional_refusal("consolidate", memories):
            return refusal
        if not memories:
            return error_result("No matching memories found")
        if refusal := unlisted_refusal(wanted, memories) or self._refused_again("merge", memories, content):
            return refusal
        if self.staged:
            return self._propose("merge", memories, content, "consolidated")
        merged = merge(self.agent, memories, content, via=VIA, session_id=self.session_id)
        db.session.commit()
        self._count_applied("consolidated", len(memories))
        return {
            "type": "consolidated",
            "merged_count": len(memories),
            "new_id": merged.id,
            "new_content": merged.content,
        }

    def _update(self, id: str = "", content: str = "", **_: str) -> dict[str, Any]:
        if not id.strip():
            return param_error("update", "id")
        if not content.strip():
            return param_error("update", "content")
        memory = next(iter(self._memories(parse_ids(id))), None)
        if memory is None:
            return error_result(f"Memory #{id} not found")
        if refusal := self._refused_again("rewrite", [memory], content):
            return refusal
        if self.staged:
            return self._propose("rewrite", [memory], content, "updated")
        rewrite(memory, content, via=VIA, session_id=self.session_id)
        db.session.commit()
        self._count_applied("updated", 1)
        return {"type": "updated", "id": memory.id, "content": memory.content}

    def _delete(self, id: str = "", ids: str = "", **_: str) -> dict[str, Any]:
        wanted = parse_ids(ids) if ids.strip() else parse_ids(id) if id.strip() else None
        if wanted is None:
            return param_error("delete", "id or ids")
        memories = self._memories(wanted)
        if refusal := constitutional_refusal("delete", memories):
            return refusal
        if memories and (refusal := self._refused_again("delete", memories, None)):
            return refusal
        if self.staged and memories:
            return self._propose("delete", memories, None, "deleted")
        remove(memories, via=VIA, session_id=self.session_id)
        db.session.commit()
        self._count_applied("deleted", len(memories))
        return {"type": "deleted", "count": len(memories)}

    def _protect(self, id: str = "", **_: str) -> dict[str, Any]:
        if not id.strip():
            return param_error("protect", "id")
        memory = next(iter(self._memories(parse_ids(id))), None)
        if memory is None:
            return error_result(f"Memory #{id} not found")
        before = memory.snapshot()
        memory.constitutional = True
        record_change(memory, "memory_refinement_protect", before, via=VIA, session_id=self.session_id)
        db.session.commit()
        self._count_applied("protected", 1)
        return {"type": "protected", "id": memory.id, "content": memory.content}

    def _complete(self, summary: str = "", **_: str) -> dict[str, Any]:
        if not summary.strip():
            return param_error("complete", "summary")
        self._note(summary.strip())
        self.summaries.append(summary.strip())
        self.pass_done = True
        if not self.passes_after and len(self.summaries) < self.passes_begun:
            self.close_unfinished(self.passes_begun)
        elif not self.passes_after:
            self.close("memory_refinement_complete", summary=self.summary)
            self.status = "complete"
        return {"type": "refinement_complete", "summary": summary.strip(), "stats": self.stats}

    def close_unfinished(self, passes: int) -> None:
        """Close the session as incomplete: of its `passes` (one per audience), some ended, or were never
        reached, without their model calling complete."""
        left = passes - len(self.summaries)
        reason = (
            f"{left} of its {passes} passes (one per audience) ended without calling complete"
            if passes > 1
            else "the session ended without calling complete"
        )
        self.close(
            "memory_refinement_incomplete",
            reason=reason,
            **({"summary": self.summary} if self.summaries else {}),
        )
        self.status = "incomplete"

    @property
    def summary(self) -> str:
        """What the passes' models said they did, together (the closing row keeps it for admins)."""
        return " ".join(self.summaries)

    def _note(self, summary: str) -> None:
        """Remember what the pass did, heard by its audience; a pass that changed nothing (or only proposed)
        has nothing worth remembering."""
        if not self.pass_applied:
            return
        note = AgentMemory(
            agent=self.agent,
            content=f"Refinement session: {summary}"[:10_000],
            memory_type="journal",
            **self.audience.columns(),
        )
        db.session.add(note)
        record_change(note, "memory_create", None, via=VIA, session_id=self.session_id)

    def close(self, action: str, **data: Any) -> None:
        """Write the session's closing audit row (with stats and token figures) and stamp the agent; a session
        that proposed changes leaves them as a proposal, with it."""
        self.agent.last_refinement_at = utcnow()
        if self.proposed:
            because, reason = self.staged
            proposal = MemoryProposal.stage(
                self.agent,
                self.session_id,
                self.proposed,
                staged_because=because,
                reason=reason,
                summary=data.get("summary"),
                expiry=self.proposal_expiry,
            )
            data.update(proposal_id=proposal.id, proposed=len(self.proposed))
        AuditLog.record(
            action,
            self.agent,
            account_id=self.agent.account_id,
            agent_id=self.agent.id,
            session_id=self.session_id,
            tokens_after=core_token_usage(self.agent.id),
            **self._figures(),
            **data,
        )
        db.session.commit()

    def _figures(self) -> dict[str, Any]:
        """What every closing row says about the session: its stats and the core tokens it started with."""
        return {"stats": self.stats, "mutations": self.mutations, "tokens_before": self.start_tokens}

    def _check_floor(self) -> dict[str, Any] | None:
        """Roll the whole session back if core memory fell, or would fall with what it proposed, below the
        floor (its proposals are dropped); None when it is fine."""
        usage = core_token_usage(self.agent.id) - sum(change.saves for change in self.proposed)
        if usage >= self.floor * self.start_tokens:
            return None
        self.proposed.clear()
        self.agent.last_refinement_at = utcnow()
        roll_back_session(
            self.agent,
            self.session_id,
            user_id=None,
            via=VIA,
            reason=f"core memory fell to {usage} tokens",
            **self._figures(),
        )
        db.session.commit()
        self.status = "rolled_back"
        return error_result(
            f"Core memory fell to {usage} tokens, below {self.floor:.0%} of the {self.start_tokens} it started "
            "with. The whole session has been rolled back. Stop now."
        )

    def _propose(
        self, kind: str, memories: list[AgentMemory], content: str | None, counted: str
    ) -> dict[str, Any]:
        """Keep the change for review instead of making it (ValueError for text no memory may have)."""
        change = ProposedChange.build(kind, memories, content)
        self.proposed.append(change)
        self.stats[counted] += len(memories)
        return {
            "type": "proposed",
            "action": kind,
            "ids": change.memory_ids,
            "note": "Staged for review: an admin applies it or not later. These memories are not listed again "
            "in this session.",
        }

    def _count_applied(self, counted: str, memories: int) -> None:
        """Count a change made at once; if the drift alarm has now gone on, stage the rest of the session."""
        self.stats[counted] += memories
        self.pass_applied += memories
        if counted != "protected" and self.drift_alarm and (reason := self.drift_alarm()):
            self.staged = ("drift", reason)

    def _refused_again(
        self, kind: str, memories: list[AgentMemory], content: str | None
    ) -> dict[str, Any] | None:
        """The error when a change a person rejected is proposed again unchanged; None otherwise."""
        for change in self.refused:
            if change.repeats(kind, memories, content):
                when = change.proposal.decided_at.strftime("%Y-%m-%d")
                return error_result(
                    f"This {kind} was refused by a person on {when}; do not propose it again unchanged."
                )
        return None

    def _memories(self, ids: list[int]) -> list[AgentMemory]:
        """The listed memories (the pass's audience) with these ids (ValueError for one it already proposed to
        change)."""
        if taken := sorted(set(ids) & self.touched):
            listed = ", ".join(f"#{memory_id}" for memory_id in taken)
            raise ValueError(f"A change of {listed} is already proposed in this session; leave it as it is.")
        return list(db.session.scalars(self._listed().where(AgentMemory.id.in_(ids))))
