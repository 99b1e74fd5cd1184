from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import current_app

from webapp import search
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, Message
from webapp.models.access import chats_heard_in, memories_heard_in
from webapp.models.memories import active_memories
from webapp.search import Excerpt
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens
from webapp.tools.base import Tool, ToolContext, cut

DESCRIPTION = (
    "Search your own long-term memory (core memories and journal entries, even those older than the week "
    "your prompt shows) and the messages of the conversations you take part in. Give a few distinctive words "
    "or a question; you get the best matches with their dates, a message with the turns around it, and the "
    "conversation's ID."
)
MEMORY_CHARS = 600
FOUND_PER_RESULT = 2
# The most source turns a memory hit shows (with the turns around each): a memory that named no turn came from
# its whole chunk, which would not fit.
SOURCES_SHOWN = 4
MESSAGE_CHARS = 400


def recall(context: ToolContext, query: str) -> dict[str, Any]:
    """The agent's best-matching memories and conversation excerpts that may be heard in this chat, within the
    recall token budget."""
    agent, chat = context.agent, context.chat
    results, left_out = search_results(
        agent, query, memories_heard_in(chat), conversations_of(agent, chats_heard_in(chat)), chat_id=chat.id
    )
    if not results:
        return {"results": [], "note": "Nothing in your memory or your conversations matches those words."}
    answer: dict[str, Any] = {"results": results}
    if left_out:
        answer["note"] = f"{left_out} more matches did not fit; search with more precise words to see them."
    return answer


def search_results(
    agent: Agent,
    query: str,
    heard: sa.ColumnElement[bool],
    chats: sa.Select,
    *,
    chat_id: int | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Recall's search and result shape, for any audience: excerpts of the chats `chats` selects (ids), each with
    the best of the agent's active memories that `heard` admits (a condition on AgentMemory) drawn from its turns,
    and by turns with them the memories that point at no turns, best first, within the recall token budget; and
    how many matches did not fit. (The recall tool and the MCP server's search_memory call this.)"""
    limit = current_app.config["RECALL_MAX_RESULTS"]
    vector = search.query_vector(query, agent_id=agent.id, chat_id=chat_id)
    mine = (active_memories(agent.id).whereclause, heard)
    # The memories first: each one's match counts toward the turns it came from in the ranking of messages.
    found = search.memory_hits(agent.id, query, search.CANDIDATES, *mine, vector=vector)
    sources = search.sources([i for i, _ in found], chats)
    # Twice as many messages as the results: those close together are one excerpt, so an excerpt holds more of
    # what answers (R@10 on LoCoMo 0.80 to 0.82 without memories; bench.locomo).
    excerpts = search.messages(
        chats, query, FOUND_PER_RESULT * limit, vector=vector, memories=search.drawn_from(found, sources)
    )
    memories = search.loaded_memories(agent.id, [i for i, _ in found[:limit]], *mine)
    return _within_budget(_shown_once(_placed(memories, sources, excerpts))[:limit])


def conversations_of(agent: Agent, readable: sa.ColumnElement[bool]) -> sa.Select:
    """The ids of the chats whose messages the agent may search: those it takes part in, of its own account,
    not discarded, that `readable` admits (a condition on Chat from webapp.models.access: chats_heard_in a
    chat, or readable_chats of a person)."""
    takes_part = sa.select(ChatAgent.chat_id).where(ChatAgent.agent_id == agent.id)
    return sa.select(Chat.id).where(
        search.backend().in_query(Chat.id, takes_part),
        Chat.account_id == agent.account_id,
        Chat.discarded_at.is_(None),
        readable,
    )


@dataclass
class _MemoryFound:
    """A memory found, with the turns it came from (and those around them) that may be read here: the excerpt
    that holds them, or a few of its own."""

    memory: AgentMemory
    turns: list[Message]


def _placed(
    memories: list[AgentMemory], sources: dict[int, list[int]], excerpts: list[Excerpt]
) -> list[_MemoryFound | Excerpt]:
    """The excerpts, best first, each shown with the best memory drawn from its turns; by turns with them, the
    memories that point at no turns (none readable here, or a whole chunk's: search.SOURCES_COUNTED), each with a
    few of its own. A memory whose few turns are in no excerpt is left out: its match counted toward them, and
    they ranked lower."""
    placed: dict[int, _MemoryFound] = {}  # by excerpt index
    alone = []
    for memory in memories:
        drawn = set(sources.get(memory.id, []))
        if not drawn or len(drawn) > search.SOURCES_COUNTED:
            alone.append(memory)
            continue
        at = next(
            (n for n, e in enumerate(excerpts) if n not in placed and drawn & {t.id for t in e.turns}), None
        )
        if at is not None:
            placed[at] = _MemoryFound(memory, excerpts[at].turns)
    shown = [placed.get(n, excerpt) for n, excerpt in enumerate(excerpts)]
    return _alternate(_with_sources(alone, sources), shown)


def _with_sources(memories: list[AgentMemory], sources: dict[int, list[int]]) -> list[_MemoryFound]:
    """The memories, each with a few of its source turns (SOURCES_SHOWN) and the turns around them, oldest
    first (one query)."""
    shown = {m.id: sources.get(m.id, [])[:SOURCES_SHOWN] for m in memories}
    stretches = search.stretches([i for ids in shown.values() for i in ids])
    found = []
    for memory in memories:
        turns = {t.id: t for i in shown[memory.id] for t in stretches.get(i, [])}
        found.append(_MemoryFound(memory, sorted(turns.values(), key=lambda t: t.id)))
    return found


def _shown_once(found: list[_MemoryFound | Excerpt]) -> list[dict[str, Any]]:
    """The hits as the model reads them, each turn shown once: in the first hit that has it. An excerpt whose
    found turns were all shown before is left out; a memory is shown even when its turns were."""
    shown: set[int] = set()
    hits = []
    for hit in found:
        if isinstance(hit, Excerpt) and set(hit.found) <= shown:
            continue
        turns = [t for t in hit.turns if t.id not in shown]
        shown.update(t.id for t in turns)
        hits.append(
            _memory_hit(hit.memory, turns) if isinstance(hit, _MemoryFound) else _excerpt_hit(hit, turns)
        )
    return hits


def _memory_hit(memory: AgentMemory, turns: list[Message]) -> dict[str, Any]:
    hit: dict[str, Any] = {
        "memory_id": memory.id,
        "type": memory.memory_type,
        "date": memory.created_at.strftime("%Y-%m-%d"),
        "content": _cut(memory.content, MEMORY_CHARS),
    }
    if memory.is_expired(utcnow()):
        hit["faded"] = True  # an old journal entry the prompt no longer shows
    if turns:  # the words it came from
        hit["conversation_id"] = turns[0].chat.public_id
        hit["excerpt"] = _lines(turns)
    return hit


def _excerpt_hit(excerpt: Excerpt, turns: list[Message]) -> dict[str, Any]:
    """A stretch of a conversation: each turn on a line with its date and author."""
    return {
        "conversation_id": excerpt.chat.public_id,
        "conversation": excerpt.chat.model_title,
        "excerpt": _lines(turns),
    }


def _lines(turns: list[Message]) -> str:
    """Each turn on a line with its time and author, and its date when the line before is of another day (a date
    on every line took a third of an excerpt's tokens: R@10 on LoCoMo 0.84 to 0.85 within the same budget)."""
    lines, day = [], None
    for t in turns:
        stamp = f"{t.created_at:%H:%M}" if t.created_at.date() == day else f"{t.created_at:%Y-%m-%d %H:%M}"
        day = t.created_at.date()
        lines.append(f"[{stamp}] {t.author_name}: {' '.join(t.excerpt(MESSAGE_CHARS).split())}")
    return "\n".join(lines)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _alternate(first: list, second: list) -> list:
    """Memories and messages by turns, each list best first."""
    merged = []
    for i in range(max(len(first), len(second))):
        merged += first[i : i + 1] + second[i : i + 1]
    return merged


def _within_budget(hits: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The hits, in order, while their tokens fit RECALL_TOKEN_BUDGET; and how many were left out."""
    budget, used = current_app.config["RECALL_TOKEN_BUDGET"], 0
    for kept, hit in enumerate(hits):
        used += count_tokens(" ".join(str(v) for v in hit.values())) + 10
        if used > budget:
            return hits[:kept], len(hits) - kept
    return hits, 0


def _label(arguments: dict[str, Any], _chat: Chat) -> str:
    return f"Searching its memory for “{cut(str(arguments.get('query', '')))}”…"


def _chip(_arguments: dict[str, Any], result: dict[str, Any], _chat: Chat) -> dict[str, Any]:
    found = len(result.get("results", []))
    return {
        "chip": f"Found {found} thing{'' if found == 1 else 's'} in its memory"
        if found
        else "Found nothing in its memory"
    }


TOOL = Tool(
    name="recall",
    description=DESCRIPTION,
    parameters={
        "type": "object",
        "properties": {
            "query": {
                "type": "string",
                "minLength": 1,
                "maxLength": 200,
                "description": "A few words to look for, e.g. a name, a place or a topic.",
            }
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    run=recall,
    label=_label,
    chip=_chip,
)
