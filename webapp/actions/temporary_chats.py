"""Temporary chats (issue 42): nothing of one is remembered (webapp.models.access.remembered keeps its words out
of every other chat, consolidation and summaries leave it alone, save_memory is not offered in it), and its
people can delete it for good, or have it deleted some days after its last message (a person's own setting,
`User.temporary_chat_days`, applied to the temporary chats they started)."""

from datetime import datetime, timedelta

import sqlalchemy as sa

from webapp.actions.memory import Refused
from webapp.extensions import db
from webapp.models import Chat, ChatAgent, ChatHidden, ChatPerson, LlmCall, Message, User
from webapp.search.indexing import forget_messages_of

KEEP_DAYS = (1, 7, 30, 90)  # what the setting offers besides keeping them until deleted


def days_kept(chat: Chat) -> int | None:
    """How many days after its last message the temporary chat is deleted: its starter's setting (None: kept)."""
    return db.session.scalar(sa.select(User.temporary_chat_days).where(User.id == chat.started_by_id))


def delete_for_good(chat: Chat) -> int:
    """Delete a temporary chat and every message of it, with what was kept of them (search vectors, reply
    sources); the cost ledger keeps its rows, no longer naming the chat. Refused for a chat that remembers (it
    is discarded instead) and while an agent is still answering in it. Returns how many messages went; the
    caller commits."""
    if chat.remembers:
        raise Refused("Only a temporary chat is deleted for good; discard this one instead.")
    if _answering(chat.id):
        raise Refused("An agent is still answering in this chat; delete it once the reply has ended.")
    forget_messages_of(chat.id)
    db.session.execute(sa.update(LlmCall).where(LlmCall.chat_id == chat.id).values(chat_id=None))
    deleted = db.session.execute(sa.delete(Message).where(Message.chat_id == chat.id)).rowcount
    for model in (ChatAgent, ChatPerson, ChatHidden):
        db.session.execute(sa.delete(model).where(model.chat_id == chat.id))
    db.session.execute(sa.delete(Chat).where(Chat.id == chat.id))
    db.session.expunge(chat)
    return deleted


def _answering(chat_id: int) -> bool:
    unfinished = sa.select(Message.id).where(
        Message.chat_id == chat_id, Message.status.in_(("pending", "streaming"))
    )
    return db.session.scalar(unfinished.limit(1)) is not None


def expired(now: datetime) -> list[Chat]:
    """The temporary chats whose starter's setting says they are due: no message for that many days (one query
    per person who set it)."""
    found: list[Chat] = []
    for person_id, days in db.session.execute(
        sa.select(User.id, User.temporary_chat_days).where(User.temporary_chat_days.is_not(None))
    ):
        found.extend(
            db.session.scalars(
                sa.select(Chat).where(
                    Chat.started_by_id == person_id,
                    Chat.remembers.is_(False),
                    Chat.last_message_at < now - timedelta(days=days),
                )
            )
        )
    return found


def delete_expired(now: datetime) -> int:
    """Delete for good the temporary chats that are due (expired), each in its own transaction; one where an
    agent is still answering waits for the next time. Returns how many went."""
    count = 0
    for chat in expired(now):
        try:
            delete_for_good(chat)
        except Refused:
            db.session.rollback()
            continue
        db.session.commit()
        count += 1
    return count
