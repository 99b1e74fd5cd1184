"""Where each memory came from, and what each reply's prompt held.

A memory's origin is its creation audit row (every path that creates a memory writes one, with the chat and
message range of a consolidation, the reply whose tool call saved it, the person, or the refinement session),
plus the reflection that promoted it. A reply's sources are its reply_sources row. Only admins see memories,
as only admins see the ledger; every member of the account sees which conversations a reply drew on.
"""

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import abort, render_template
from flask.typing import ResponseReturnValue
from flask_login import current_user

from webapp.admin.common import bp
from webapp.extensions import db
from webapp.models import AgentMemory, AuditLog, Chat, Message, ReplySources, User
from webapp.web.auth import admin_required

CREATING = ("memory_create", "memory_refinement_consolidate_create")
PROMOTING = "memory_promote"


@dataclass
class Origin:
    via: str
    data: dict[str, Any]
    session_id: str | None = None
    user_email: str | None = None
    chat: Chat | None = None
    promoted_session_id: str | None = None


def origins_for(memories: list[AgentMemory]) -> dict[int, Origin]:
    """The origin of each memory (absent when it predates audit rows): two queries for any page of them."""
    ids = [m.id for m in memories]
    if not ids:
        return {}
    rows = db.session.execute(
        sa.select(AuditLog, User.email)
        .outerjoin(User, User.id == AuditLog.user_id)
        .where(
            AuditLog.account_id == current_user.account_id,
            AuditLog.auditable_type == "AgentMemory",
            AuditLog.auditable_id.in_(ids),
            AuditLog.action.in_((*CREATING, PROMOTING)),
        )
        .order_by(AuditLog.id)
    ).all()
    origins: dict[int, Origin] = {}
    for row, email in rows:
        if row.action in CREATING and row.auditable_id not in origins:
            origins[row.auditable_id] = Origin(row.data.get("via", ""), row.data, row.session_id, email)
    for row, _email in rows:
        if row.action == PROMOTING and row.auditable_id in origins:
            origins[row.auditable_id].promoted_session_id = row.session_id or ""
    chats = _chats({o.data.get("chat_id") for o in origins.values()} - {None})
    for origin in origins.values():
        origin.chat = chats.get(origin.data.get("chat_id"))
    return origins


def _chats(ids: set[int]) -> dict[int, Chat]:
    if not ids:
        return {}
    found = db.session.scalars(
        sa.select(Chat).where(Chat.id.in_(ids), Chat.account_id == current_user.account_id)
    )
    return {chat.id: chat for chat in found}


@bp.get("/replies/<int:message_id>/sources")
@admin_required
def reply_sources(message_id: int) -> ResponseReturnValue:
    """What one reply's prompt held: its memories (deleted ones too, marked) and the conversations it used."""
    sources = db.session.scalar(
        sa.select(ReplySources)
        .join(Message, Message.id == ReplySources.message_id)
        .join(Chat, Chat.id == Message.chat_id)
        .where(ReplySources.message_id == message_id, Chat.account_id == current_user.account_id)
    )
    if sources is None:
        abort(404)
    wanted = set(sources.memory_ids) | set(sources.recalled_memory_ids)
    memories = {
        m.id: m
        for m in db.session.scalars(
            sa.select(AgentMemory).where(
                AgentMemory.id.in_(wanted), AgentMemory.agent_id == sources.message.agent_id
            )
        )
    }
    chat_ids = set(sources.summary_chat_ids) | set(sources.recalled_chat_ids) | {sources.borrowed_chat_id}
    return render_template(
        "memories/_reply_sources.html", sources=sources, memories=memories, chats=_chats(chat_ids - {None})
    )
