"""What agents remember of a person, and forgetting it (issue 42): one verb for every door (the page "What agents
remember of me", MCP's forget_memory, `flask memories forget ID --by EMAIL`).

A person's memories are those drawn from a chat they are one of the people of, found by their sources (the
messages a memory was drawn from, memory_sources) or by the chat its audience is, and that the person may hear
(so nothing of someone else's private chat). Forgetting one is a soft delete audited as the person, which an
admin can undo from the audit; a constitutional memory is kept whoever asks. A memory that is not theirs is
refused with the same words as one that does not exist.
"""

from dataclasses import dataclass

import sqlalchemy as sa

from webapp.actions.memory import Refused
from webapp.extensions import db
from webapp.models import Agent, AgentMemory, Chat, ChatPerson, MemorySource, Message, User
from webapp.models.access import memories_heard_by
from webapp.models.audit import record_change

NOT_YOURS = "No memory drawn from your chats has that id."


class NotYours(Refused):
    """Not a memory of this person's (or none at all): the same words either way."""


@dataclass
class Forgotten:
    count: int
    kept_constitutional: int


def memories_of(user: User, chat_id: int | None = None) -> sa.ColumnElement[bool]:
    """Condition on AgentMemory (joined to its Agent): the active memories drawn from the person's chats (from
    `chat_id` alone, when given, if it is one of theirs) that they may hear."""
    theirs = sa.select(ChatPerson.chat_id).where(ChatPerson.user_id == user.id)
    if chat_id is not None:
        theirs = theirs.where(ChatPerson.chat_id == chat_id)
    by_sources = (
        sa.select(MemorySource.memory_id)
        .join(Message, Message.id == MemorySource.message_id)
        .where(Message.chat_id.in_(theirs))
    )
    drawn = sa.or_(
        sa.and_(AgentMemory.audience == "chat", AgentMemory.chat_id.in_(theirs)),
        AgentMemory.id.in_(by_sources),
    )
    return sa.and_(Agent.account_id == user.account_id, AgentMemory.is_active, drawn, memories_heard_by(user))


def listed(user: User, chat_id: int | None = None) -> sa.Select:
    """The person's memories, grouped by agent, newest first."""
    return (
        sa.select(AgentMemory)
        .join(Agent, Agent.id == AgentMemory.agent_id)
        .where(memories_of(user, chat_id))
        .order_by(Agent.name, AgentMemory.created_at.desc(), AgentMemory.id.desc())
    )


def count(user: User, chat_id: int | None = None) -> int:
    query = sa.select(sa.func.count(AgentMemory.id)).join(Agent, Agent.id == AgentMemory.agent_id)
    return db.session.scalar(query.where(memories_of(user, chat_id), AgentMemory.constitutional.is_(False)))


def forget(user: User, memory_id: int, *, via: str, agent: Agent | None = None) -> AgentMemory:
    """Forget one of the person's memories (of `agent`'s, when given; committed), audited as them `via` a door
    (FORGOTTEN_WHERE); NotYours for any other id, constitutional ones included."""
    query = listed(user).where(AgentMemory.id == memory_id)
    if agent is not None:
        query = query.where(AgentMemory.agent_id == agent.id)
    memory = db.session.scalar(query)
    if memory is None or memory.constitutional:
        raise NotYours(NOT_YOURS)
    _forget(user, memory, via)
    db.session.commit()
    return memory


def forget_all(user: User, chat_id: int | None = None, *, via: str = "account") -> Forgotten:
    """Forget every memory drawn from the person's chats (or from one of them), constitutional ones kept; one
    audit row each, as one forget."""
    memories = db.session.scalars(listed(user, chat_id)).all()
    kept = sum(1 for memory in memories if memory.constitutional)
    for memory in memories:
        if not memory.constitutional:
            _forget(user, memory, via)
    db.session.commit()
    return Forgotten(len(memories) - kept, kept)


def learned_only_from(person: User) -> sa.Select:
    """The active memories agents learned only from the person's own private chats (private chats whose one
    person they are): every source turn in them, or, with no source, heard only in one of them."""
    own = (
        sa.select(Chat.id)
        .where(Chat.visibility == "private", Chat.account_id == person.account_id)
        .where(sa.exists().where(ChatPerson.chat_id == Chat.id, ChatPerson.user_id == person.id))
        .where(~sa.exists().where(ChatPerson.chat_id == Chat.id, ChatPerson.user_id != person.id))
    )
    sources = sa.select(MemorySource.message_id).where(MemorySource.memory_id == AgentMemory.id)
    elsewhere = sa.exists().where(
        MemorySource.memory_id == AgentMemory.id,
        MemorySource.message_id == Message.id,
        Message.chat_id.not_in(own),
    )
    only_theirs = sa.or_(
        sa.and_(sa.exists(sources), ~elsewhere),
        sa.and_(~sa.exists(sources), AgentMemory.audience == "chat", AgentMemory.chat_id.in_(own)),
    )
    return (
        sa.select(AgentMemory)
        .join(Agent, Agent.id == AgentMemory.agent_id)
        .where(Agent.account_id == person.account_id, AgentMemory.is_active, only_theirs)
        .order_by(AgentMemory.id)
    )


def forget_learned_only_from(person: User, by: User) -> Forgotten:
    """Forget (not committed) what agents learned only from the person's own private chats, audited as `by`
    (the admin removing them); constitutional memories are kept."""
    memories = db.session.scalars(learned_only_from(person)).all()
    kept = sum(1 for memory in memories if memory.constitutional)
    for memory in memories:
        if not memory.constitutional:
            _forget(by, memory, "removal")
    return Forgotten(len(memories) - kept, kept)


def _forget(user: User, memory: AgentMemory, via: str) -> None:
    before = memory.snapshot()
    memory.soft_delete()
    record_change(memory, "memory_delete", before, via=via, user_id=user.id)
