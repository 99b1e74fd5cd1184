"""A chat narrowed (made private, or a person taken out of a private chat) narrows what was drawn from it (issue
42.5): a memory whose sources are in the chat but which is heard more widely (by everyone, or in a shared chat)
takes the chat as its audience, so people no longer in the chat stop hearing it in other chats' prompts, recall,
MCP and the API. A memory heard in the chat itself needs nothing: who hears it follows who may read the chat, so
a person taken out stops hearing it, and hears it again once added back. Each change is audited as an audience
change, by the person who narrowed the chat."""

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import AgentMemory, Chat, MemorySource, Message, User
from webapp.models.audit import record_change

NARROWED_VIA = "narrowing"


def narrow_to(chat: Chat, by: User) -> int:
    """Give the chat's audience to every active memory drawn from it that is heard more widely (not committed);
    how many. Nothing while the chat is shared."""
    if not chat.is_private:
        return 0
    drawn_here = sa.exists().where(
        MemorySource.memory_id == AgentMemory.id,
        MemorySource.message_id == Message.id,
        Message.chat_id == chat.id,
    )
    wider = sa.or_(
        AgentMemory.audience == "everyone",
        AgentMemory.chat_id.in_(sa.select(Chat.id).where(Chat.visibility == "shared", Chat.id != chat.id)),
    )
    memories = db.session.scalars(
        sa.select(AgentMemory).where(AgentMemory.is_active, drawn_here, wider)
    ).all()
    for memory in memories:
        before = memory.snapshot()
        memory.audience, memory.chat_id = "chat", chat.id
        record_change(memory, "memory_audience", before, via=NARROWED_VIA, user_id=by.id, chat_id=chat.id)
    return len(memories)
