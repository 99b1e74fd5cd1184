from typing import Any

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import Chat, ChatAgent, public_ids
from webapp.models.access import chats_heard_in
from webapp.models.chats import recent_messages
from webapp.timeutil import utcnow
from webapp.tools.base import Tool, ToolContext, chat_named

DESCRIPTION = (
    "Borrow recent messages from another conversation you participate in. The messages will be included in "
    "your system context for your next response in the current conversation. Use the conversation ID from "
    "your active conversations list."
)
BORROWED_MESSAGES = 10
BORROWED_MESSAGE_CHARS = 2_000


def borrow_context(context: ToolContext, conversation_id: str) -> dict[str, Any]:
    """Stage the last messages of another of the agent's chats for its next activation in this chat."""
    if context.agent is None or context.chat is None:
        return {"error": "Requires chat and agent context"}
    source = _source_chat(context, conversation_id)
    if source is None:
        return {"error": "Conversation not found or you are not a participant"}
    if source.id == context.chat.id:
        return {"error": "Cannot borrow from the current conversation"}
    recent = recent_messages(source.id, BORROWED_MESSAGES)
    if not recent:
        return {"error": "No messages found in that conversation"}
    mine = _membership(context)
    if mine is None:
        return {"error": "You are no longer a participant of the current conversation"}
    borrowed = [{"author": m.author_name, "content": m.excerpt(BORROWED_MESSAGE_CHARS)} for m in recent]
    mine.borrowed_context_json = {
        "source_conversation_id": source.public_id,
        "messages": borrowed,
        # Marks this staging, so a reply clears only the context its own prompt included (DESIGN 5.2).
        "staged_at": utcnow().isoformat(timespec="microseconds"),
    }
    db.session.commit()
    return {
        "success": True,
        "message": f'Here are the recent messages of "{source.model_title}": use them in this reply. They '
        "will also be in your system prompt for your next response in this conversation.",
        "message_count": len(recent),
        "messages": borrowed,  # usable in the same turn, not only the next one
    }


def _source_chat(context: ToolContext, conversation_id: str) -> Chat | None:
    """The chat behind the opaque id, only if this agent takes part in it, in its own account, not discarded,
    and everyone present in the current chat may read it (webapp.models.access.chats_heard_in); else None, as
    for an unknown id."""
    # Models often copy the id with the brackets or quotes the prompt shows around it.
    chat_id = public_ids.decode(conversation_id.strip().strip("[]\"'"))
    if chat_id is None:
        return None
    return db.session.scalar(
        sa.select(Chat)
        .join(ChatAgent, ChatAgent.chat_id == Chat.id)
        .where(
            Chat.id == chat_id,
            Chat.account_id == context.agent.account_id,
            Chat.discarded_at.is_(None),
            ChatAgent.agent_id == context.agent.id,
            chats_heard_in(context.chat),
        )
    )


def _membership(context: ToolContext) -> ChatAgent | None:
    return db.session.scalar(
        sa.select(ChatAgent).where(
            ChatAgent.chat_id == context.chat.id, ChatAgent.agent_id == context.agent.id
        )
    )


UNNAMED_LABEL = "Reading another conversation…"
UNNAMED_CHIP = "Borrowed messages from another conversation"


def _label(arguments: dict[str, Any], chat: Chat) -> str:
    source = chat_named(arguments.get("conversation_id"), chat)
    return f"Reading “{source.display_title}”…" if source else UNNAMED_LABEL


def _chip(arguments: dict[str, Any], result: dict[str, Any], chat: Chat) -> dict[str, Any]:
    source = chat_named(arguments.get("conversation_id"), chat)
    count = result.get("message_count", 0)
    title = source.display_title if source else "another conversation"
    chip = f"Borrowed {count} message{'' if count == 1 else 's'} from “{title}”"
    return {"chip": chip, "chat_id": source.id if source else None}


TOOL = Tool(
    name="borrow_context",
    description=DESCRIPTION,
    parameters={
        "type": "object",
        "properties": {
            "conversation_id": {
                "type": "string",
                "minLength": 1,
                "maxLength": 64,
                "description": "The conversation ID to borrow context from (from your active conversations list)",
            }
        },
        "required": ["conversation_id"],
        "additionalProperties": False,
    },
    run=borrow_context,
    label=_label,
    chip=_chip,
    failure="read that conversation",
    names_a_chat=True,
)
