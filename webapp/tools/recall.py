from typing import Any

import sqlalchemy as sa
from flask import current_app
from sqlalchemy.orm import joinedload

from webapp.extensions import db
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, Message, search
from webapp.models.memories import active_memories
from webapp.models.search import Match
from webapp.timeutil import utcnow
from webapp.tokens import count_tokens
from webapp.tools.base import Tool, ToolContext

DESCRIPTION = (
    "Search your own long-term memory (core memories and journal entries, even those older than the week "
    "your prompt shows) and the messages of the conversations you take part in. Give a few distinctive words; "
    "you get the best matches with their dates and the conversation's ID."
)
MEMORY_CHARS = 600
MESSAGE_CHARS = 400


def recall(context: ToolContext, query: str) -> dict[str, Any]:
    """The agent's best-matching memories and conversation messages, within the recall token budget."""
    limit = current_app.config["RECALL_MAX_RESULTS"]
    memories = [_memory_hit(m) for m in _memories(context.agent, query, limit)]
    messages = [_message_hit(m) for m in _messages(context.agent, query, limit)]
    results, left_out = _within_budget(_alternate(memories, messages)[:limit])
    if not results:
        return {"results": [], "note": "Nothing in your memory or your conversations matches those words."}
    answer: dict[str, Any] = {"results": results}
    if left_out:
        answer["note"] = f"{left_out} more matches did not fit; search with more precise words to see them."
    return answer


def _memories(agent: Agent, query: str, limit: int) -> list[AgentMemory]:
    """Active memories of this agent only (expired journal included), best match first."""
    mine = active_memories(agent.id)
    hits = search.ranked(AgentMemory, query, Match.ANY_WORD, mine.whereclause)
    if hits is None:
        return []
    return list(
        db.session.scalars(mine.join(hits, hits.c.id == AgentMemory.id).order_by(hits.c.rank).limit(limit))
    )


def _messages(agent: Agent, query: str, limit: int) -> list[Message]:
    """Finished messages of the chats this agent takes part in (its own account, not discarded)."""
    member_of = (
        sa.select(ChatAgent.chat_id)
        .join(Chat, Chat.id == ChatAgent.chat_id)
        .where(
            ChatAgent.agent_id == agent.id, Chat.account_id == agent.account_id, Chat.discarded_at.is_(None)
        )
    )
    readable = (
        Message.chat_id.in_(member_of),
        Message.status == "done",
        Message.role.in_(("user", "assistant")),
    )
    hits = search.ranked(Message, query, Match.ANY_WORD, *readable)
    if hits is None:
        return []
    return list(
        db.session.scalars(
            sa.select(Message)
            .join(hits, hits.c.id == Message.id)
            .options(joinedload(Message.chat), joinedload(Message.user), joinedload(Message.agent))
            .order_by(hits.c.rank)
            .limit(limit)
        )
    )


def _memory_hit(memory: AgentMemory) -> dict[str, Any]:
    hit = {
        "memory_id": memory.id,
        "type": memory.memory_type,
        "date": memory.created_at.strftime("%Y-%m-%d"),
        "content": _cut(memory.content, MEMORY_CHARS),
    }
    if memory.is_expired(utcnow()):
        hit["faded"] = True  # an old journal entry the prompt no longer shows
    return hit


def _message_hit(message: Message) -> dict[str, Any]:
    return {
        "conversation_id": message.chat.public_id,
        "conversation": message.chat.model_title,
        "date": message.created_at.strftime("%Y-%m-%d %H:%M"),
        "author": message.author_name,
        "content": message.excerpt(MESSAGE_CHARS),
    }


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _alternate(first: list[dict], second: list[dict]) -> list[dict]:
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
)
