"""What one person may do with one agent's memory, outside any chat (MCP calls these): search it and the agent's conversations,
save to it, list what the agent's prompt holds, read its core memory.

The person hears what they would hear outside any chat (webapp.models.access.memories_heard_by) and reads the
agent's conversations they may read (readable_chats); a member sees what the agent's "What members may see of
this agent's memory" setting allows: everything, its core memories only, or nothing (every call refused). A
memory saved here belongs to a private chat of that person with the agent (source "mcp"), so it is heard only
where they are. Nothing here edits or deletes a memory: constitutional memories stay as they are.
"""

from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.llm import targets
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, ChatPerson, User
from webapp.models.access import chats_searched_by, memories_heard_by, memory_chats_heard, readable_chats
from webapp.models.memories import active_memories
from webapp.models.memory_budget import memories_within
from webapp.prompting.build import memory_budget
from webapp.timeutil import utcnow
from webapp.tools.recall import conversations_of, search_results
from webapp.tools.save_memory import fading_note, remember

NOTES_TITLE = "Notes via MCP"
VIA = "mcp"  # the audit rows' label: the admin pages say "via MCP by <person>"


class Refused(Exception):
    """The person may not do this (the message says why, for the client to show)."""


def search_memory(user: User, agent: Agent, query: str) -> dict[str, Any]:
    """The recall search over the agent's memories this person may hear and its conversations they may read,
    in recall's result shape."""
    heard = _heard(user, agent)
    chats = conversations_of(agent, chats_searched_by(user))
    results, left_out = search_results(agent, query.strip(), heard, chats)
    if not results:
        return {"results": [], "note": f"Nothing you may read of {agent.name}'s memory matches those words."}
    answer: dict[str, Any] = {"results": results}
    if left_out:
        answer["note"] = f"{left_out} more matches did not fit; search with more precise words to see them."
    return answer


def save_memory(user: User, agent: Agent, content: str, memory_type: str) -> dict[str, Any]:
    """Save a memory for the agent, told by this person: heard where they are (their notes chat with it), with
    an audit row via MCP in their name, undoable like any other."""
    _visibility(user, agent)
    content = content.strip()
    if not content:
        raise Refused("The memory is empty: say what the agent should remember.")
    chat = notes_chat(user, agent)
    memory, saved = remember(
        agent, chat, content, memory_type, via=VIA, user_id=user.id, by=user.display_name
    )
    if not saved:
        return {
            "saved": False,
            "memory_id": memory.id,
            "note": f"{agent.name} already remembers exactly this.",
        }
    return {
        "saved": True,
        "memory_id": memory.id,
        "memory_type": memory_type,
        "heard_by": f"you only: it belongs to your private chat with {agent.name}, {NOTES_TITLE!r}",
        "note": fading_note(memory_type, f"{agent.name}'s"),
    }


def prompt_memory(user: User, agent: Agent) -> dict[str, Any]:
    """What the agent's prompt would hold of its memory in a new private chat of this person: its constitutional
    memories, then core oldest first and the week's journal newest first, within its memory budget (a chat
    with messages adds the memories that match them first)."""
    visible = _visibility(user, agent)
    now, budget = utcnow(), memory_budget(targets.for_agent(agent), agent)
    heard_chats = db.session.scalars(memory_chats_heard(agent.id, readable_chats(user))).all()
    within = memories_within(agent.id, now, budget, heard_chats=heard_chats).shown_as(visible)
    answer: dict[str, Any] = {
        "memories": [_listed(memory) for memory in within.listed],
        "left_out": {"core": within.core_left_out, "journal": within.journal_left_out},
        "budget_tokens": budget,
    }
    if visible == "core":
        answer["note"] = f"Only core memories are shown to members ({agent.name}'s setting)."
    return answer


def core_memory(user: User, agent: Agent) -> str:
    """The agent's active core memories (and constitutional ones) this person may hear, oldest first, as text."""
    _visibility(user, agent)
    memories = db.session.scalars(
        active_memories(agent.id)
        .where(sa.or_(AgentMemory.memory_type == "core", AgentMemory.constitutional), memories_heard_by(user))
        .order_by(AgentMemory.created_at, AgentMemory.id)
    ).all()
    lines = [f"# {agent.name}'s core memory", ""]
    lines += [
        f"- [{m.created_at:%Y-%m-%d}] {m.content}{' (constitutional)' if m.constitutional else ''}"
        for m in memories
    ]
    return "\n".join(lines if memories else [*lines, "(none yet)"]) + "\n"


def notes_chat(user: User, agent: Agent) -> Chat:
    """This person's private chat with the agent for what they tell it over MCP: the oldest that is still
    private, theirs and not discarded, else a new one (flushed, so what it hears can be asked at once)."""
    chat = db.session.scalar(
        sa.select(Chat)
        .join(ChatAgent, sa.and_(ChatAgent.chat_id == Chat.id, ChatAgent.agent_id == agent.id))
        .join(ChatPerson, sa.and_(ChatPerson.chat_id == Chat.id, ChatPerson.user_id == user.id))
        .where(
            Chat.source == "mcp",
            Chat.started_by_id == user.id,
            Chat.visibility == "private",
            Chat.discarded_at.is_(None),
        )
        .order_by(Chat.id)
        .limit(1)
    )
    if chat is None:
        chat = Chat.start(user, [agent], title=NOTES_TITLE, source="mcp")
        db.session.flush()
    return chat


def _visibility(user: User, agent: Agent) -> str:
    """What this person may see of the agent's memory ("prompt" or "core"); refused when nothing."""
    visible = agent.memory_visible_to(user)
    if visible == "none":
        raise Refused(
            f"{agent.name}'s memory is not open to members: its setting \"What members may see of this agent's "
            'memory" is "nothing". An admin of your account can change it on the agent\'s page.'
        )
    return visible


def _heard(user: User, agent: Agent) -> sa.ColumnElement[bool]:
    """Condition on AgentMemory: what this person may hear and see of the agent's memory."""
    heard = memories_heard_by(user)
    if _visibility(user, agent) == "core":
        return sa.and_(heard, AgentMemory.memory_type == "core")
    return heard


def _listed(memory: AgentMemory) -> dict[str, Any]:
    listed = {
        "memory_id": memory.id,
        "type": memory.memory_type,
        "date": memory.created_at.strftime("%Y-%m-%d"),
        "content": memory.content,
    }
    if memory.constitutional:
        listed["constitutional"] = True
    return listed
