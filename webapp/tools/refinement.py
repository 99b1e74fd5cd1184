"""The refinement tool (spec 002): one polymorphic tool, refine_memory, an agent uses on its own core memory
during a refinement session (its context). It is never in an agent's enabled tools; only the refinement job
offers it. Like every tool, its arguments are checked against its schema before it runs.

Safety the spec lacks (DESIGN.md 5.4): every audit row carries the session id; at most `max_mutations`
changes per session; after each change, if core tokens fall below `floor` times the session's starting
tokens, the whole session is rolled back from its audit rows and the model is told to stop.

Memories are heard by different people (webapp.models.access): a merge of memories of different audiences is
refused, so no memory becomes heard where one of its parts may not be; a merged memory keeps its parts'
audience, and the session's closing journal note takes the audience of what it changed when that is one.
"""

from dataclasses import dataclass, field
from typing import Any

from webapp.extensions import db
from webapp.models import Agent, AgentMemory, AuditLog
from webapp.models.access import same_audience
from webapp.models.audit import record_change, roll_back_session
from webapp.models.memories import core_memories, core_token_usage, like_pattern, token_pages
from webapp.timeutil import utcnow
from webapp.tools.base import Tool

ACTIONS = ("page", "search", "consolidate", "update", "delete", "protect", "complete")
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
    status: str = "running"  # then: complete, rolled_back (or incomplete, set by the job)
    # One memory of each audience the session changed (the closing note may be heard only where all are).
    audiences: list[AgentMemory] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status != "running"

    @property
    def mutations(self) -> int:
        """Memories changed so far: a delete or merge of 14 memories is 14 changes, not one call."""
        return sum(self.stats.values())

    def run(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Execute one tool call; errors come back as results the model can read."""
        if self.finished:
            return _error("The session is over; no more changes are accepted.")
        action = str(arguments.get("action", ""))
        if action not in ACTIONS:
            return _error(f"Invalid action '{action}'")
        params = {k: str(v) for k, v in arguments.items() if k != "action" and v is not None}
        try:
            if action in MUTATIONS and (refusal := self._over_cap(action, params)):
                return refusal
            result = getattr(self, f"_{action}")(**params)
        except (ValueError, TypeError) as error:  # bad parameters or content the model itself rejects
            db.session.rollback()
            return _error(str(error))
        if action in MUTATIONS and result.get("type") != "error":
            return self._check_floor() or result
        return result

    def _over_cap(self, action: str, params: dict[str, str]) -> dict[str, Any] | None:
        """The refusal when the call would change more memories than the session has left; else None."""
        left = self.max_mutations - self.mutations
        listed = params.get("ids", "").strip() or params.get("id", "")
        wanted = len(set(_ids(listed))) if action in ("consolidate", "delete") else 1
        if wanted <= left:
            return None
        if left <= 0:
            return _error(f"This session allows at most {self.max_mutations} changes; call complete now.")
        return _error(
            f"This session allows at most {self.max_mutations} changes and {left} are left; this call would "
            f"change {wanted} memories. Change fewer, or call complete."
        )

    def pages(self) -> list[list[AgentMemory]]:
        """The agent's core memories, oldest first, in pages within the page budget."""
        return token_pages(db.session.scalars(core_memories(self.agent.id)).all(), self.page_tokens)

    def _page(self, page: str = "", **_: str) -> dict[str, Any]:
        if not page.strip().isdigit():
            return _param_error("page", "page (a number)")
        pages, number = self.pages(), int(page)
        if not 1 <= number <= len(pages):
            return _error(f"There are {len(pages)} pages; ask for a page from 1 to {len(pages)}.")
        return {
            "type": "page",
            "page": number,
            "pages": len(pages),
            "results": [_summary(m) for m in pages[number - 1]],
        }

    def _search(self, query: str = "", **_: str) -> dict[str, Any]:
        if not query.strip():
            return _param_error("search", "query")
        found = db.session.scalars(
            core_memories(self.agent.id).where(
                AgentMemory.content.ilike(like_pattern(query.strip()), escape="\\")
            )
        ).all()
        shown = token_pages(found, self.page_tokens)[:1]
        results = [_summary(m) for m in (shown[0] if shown else [])]
        result = {"type": "search_results", "query": query, "count": len(found), "results": results}
        if len(results) < len(found):
            result["note"] = (
                f"Only the first {len(results)} fit; search with more precise words for the others."
            )
        return result

    def _consolidate(self, ids: str = "", content: str = "", **_: str) -> dict[str, Any]:
        if not ids.strip():
            return _param_error("consolidate", "ids")
        if not content.strip():
            return _param_error("consolidate", "content")
        memories = self._memories(_ids(ids))
        if refusal := _constitutional_refusal("consolidate", memories):
            return refusal
        if not memories:
            return _error("No matching memories found")
        if refusal := _audience_refusal(memories):
            return refusal
        merged = AgentMemory(
            agent=self.agent,
            content=content,
            memory_type="core",
            created_at=min(m.created_at for m in memories),
            chat_id=memories[0].chat_id,
            audience=memories[0].audience,
        )
        self._changed(merged)
        db.session.add(merged)
        record_change(
            merged, "memory_refinement_consolidate_create", None, via=VIA, session_id=self.session_id
        )
        for memory in memories:
            before = memory.snapshot()
            memory.soft_delete()
            record_change(
                memory,
                "memory_refinement_consolidate",
                before,
                via=VIA,
                session_id=self.session_id,
                merged_into=merged.id,
            )
        db.session.commit()
        self.stats["consolidated"] += len(memories)
        return {
            "type": "consolidated",
            "merged_count": len(memories),
            "new_id": merged.id,
            "new_content": merged.content,
        }

    def _update(self, id: str = "", content: str = "", **_: str) -> dict[str, Any]:
        if not id.strip():
            return _param_error("update", "id")
        if not content.strip():
            return _param_error("update", "content")
        memory = next(iter(self._memories(_ids(id))), None)
        if memory is None:
            return _error(f"Memory #{id} not found")
        before = memory.snapshot()
        memory.content = content
        self._changed(memory)
        record_change(memory, "memory_refinement_update", before, via=VIA, session_id=self.session_id)
        db.session.commit()
        self.stats["updated"] += 1
        return {"type": "updated", "id": memory.id, "content": memory.content}

    def _delete(self, id: str = "", ids: str = "", **_: str) -> dict[str, Any]:
        wanted = _ids(ids) if ids.strip() else _ids(id) if id.strip() else None
        if wanted is None:
            return _param_error("delete", "id or ids")
        memories = self._memories(wanted)
        if refusal := _constitutional_refusal("delete", memories):
            return refusal
        for memory in memories:
            before = memory.snapshot()
            memory.soft_delete()
            self._changed(memory)
            record_change(memory, "memory_refinement_delete", before, via=VIA, session_id=self.session_id)
        db.session.commit()
        self.stats["deleted"] += len(memories)
        return {"type": "deleted", "count": len(memories)}

    def _protect(self, id: str = "", **_: str) -> dict[str, Any]:
        if not id.strip():
            return _param_error("protect", "id")
        memory = next(iter(self._memories(_ids(id))), None)
        if memory is None:
            return _error(f"Memory #{id} not found")
        before = memory.snapshot()
        memory.constitutional = True
        self._changed(memory)
        record_change(memory, "memory_refinement_protect", before, via=VIA, session_id=self.session_id)
        db.session.commit()
        self.stats["protected"] += 1
        return {"type": "protected", "id": memory.id, "content": memory.content}

    def _complete(self, summary: str = "", **_: str) -> dict[str, Any]:
        if not summary.strip():
            return _param_error("complete", "summary")
        # A session that changed nothing has nothing worth remembering; one that changed memories of several
        # audiences has no one audience its summary could be heard by (the closing row keeps it for admins).
        if self.mutations and len(self.audiences) == 1:
            [heard] = self.audiences
            note = AgentMemory(
                agent=self.agent,
                content=f"Refinement session: {summary.strip()}"[:10_000],
                memory_type="journal",
                chat_id=heard.chat_id if heard.audience == "chat" else None,
                audience=heard.audience,
            )
            db.session.add(note)
            record_change(note, "memory_create", None, via=VIA, session_id=self.session_id)
        self.close("memory_refinement_complete", summary=summary.strip())
        self.status = "complete"
        return {"type": "refinement_complete", "summary": summary.strip(), "stats": self.stats}

    def close(self, action: str, **data: Any) -> None:
        """Write the session's closing audit row (with stats and token figures) and stamp the agent."""
        self.agent.last_refinement_at = utcnow()
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
        """Roll the whole session back if core memory fell below the floor; None when it is fine."""
        usage = core_token_usage(self.agent.id)
        if usage >= self.floor * self.start_tokens:
            return None
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
        return _error(
            f"Core memory fell to {usage} tokens, below {self.floor:.0%} of the {self.start_tokens} it started "
            "with. The whole session has been rolled back. Stop now."
        )

    def _changed(self, memory: AgentMemory) -> None:
        """Note the audience of a memory the session changed."""
        if not any(same_audience(memory, seen) for seen in self.audiences):
            self.audiences.append(memory)

    def _memories(self, ids: list[int]) -> list[AgentMemory]:
        return list(db.session.scalars(core_memories(self.agent.id).where(AgentMemory.id.in_(ids))))


def _constitutional_refusal(verb: str, memories: list[AgentMemory]) -> dict[str, Any] | None:
    """The error result when any of the memories is constitutional (they cannot be deleted or merged)."""
    protected = [m.id for m in memories if m.constitutional]
    if not protected:
        return None
    return _error(f"Cannot {verb} constitutional memories: {', '.join(map(str, protected))}")


def _audience_refusal(memories: list[AgentMemory]) -> dict[str, Any] | None:
    """The error result when the memories are not all heard by the same people (they cannot become one)."""
    if all(same_audience(memories[0], m) for m in memories[1:]):
        return None
    heard = ", ".join(f"#{m.id} heard by {m.heard_by}" for m in memories)
    return _error(
        f"Cannot consolidate memories heard by different people ({heard}): a merged memory would be heard where "
        "some of them may not be. Consolidate only memories with the same heard_by."
    )


def _ids(text: str) -> list[int]:
    ids = [part.strip().lstrip("#") for part in text.split(",") if part.strip()]
    if not all(part.isdigit() for part in ids):
        raise ValueError(f"ids must be memory numbers separated by commas, not {text!r}")
    return [int(part) for part in ids]


def _summary(memory: AgentMemory) -> dict[str, Any]:
    return {
        "id": memory.id,
        "content": memory.content,
        "created_at": memory.created_at.isoformat(),
        "tokens": memory.token_estimate,
        "constitutional": memory.constitutional,
        "heard_by": memory.heard_by,
    }


def _error(message: str) -> dict[str, Any]:
    return {"type": "error", "error": message, "allowed_actions": list(ACTIONS)}


def _param_error(action: str, param: str) -> dict[str, Any]:
    return _error(f"{param} is required for {action}")


def refine_memory(session: RefinementSession, **arguments: Any) -> dict[str, Any]:
    """Run one refine_memory call in its session."""
    return session.run(arguments)


NUMBERS = ["string", "integer"]  # a memory or page number, as text or as a number

TOOL = Tool(
    name="refine_memory",
    description="Memory refinement tool. Actions: page, search, consolidate, update, delete, protect, complete.",
    parameters={
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": list(ACTIONS),
                "description": "page, search, consolidate, update, delete, protect, or complete",
            },
            "page": {"type": NUMBERS, "description": "Page number of your core memories (for page)"},
            "query": {"type": "string", "description": "Search query (for search action)"},
            "ids": {"type": NUMBERS, "description": "Comma-separated memory IDs (for consolidate, delete)"},
            "id": {"type": NUMBERS, "description": "Single memory ID (for update, delete, protect)"},
            "content": {"type": "string", "description": "New content (for consolidate, update)"},
            "summary": {"type": "string", "description": "Refinement summary (for complete)"},
        },
        "required": ["action"],
    },
    run=refine_memory,
    in_replies=False,
)
