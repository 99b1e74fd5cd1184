"""Where each memory came from, and what each reply's prompt held.

A memory's origin is its creation audit row (every path that creates a memory writes one, with the chat and
message range of a consolidation, the reply whose tool call saved it, the person, or the refinement session),
plus the reflection that promoted it. A reply's sources are its reply_sources row. Only admins see memories,
as only admins see the ledger; every member of the account sees which conversations a reply drew on.

A chat is named by its title (and linked) only to an admin who may read it (webapp.models.access): a private
chat of other people is "private: Dana's chat", by its people's names, never by its title.
"""

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import abort, render_template
from flask.typing import ResponseReturnValue
from flask_login import current_user

from webapp import search
from webapp.admin.common import bp
from webapp.extensions import db
from webapp.models import AgentMemory, AuditLog, Chat, ChatPerson, Message, ReplySources, User
from webapp.models.access import ChatNames, readable_chats
from webapp.models.audit import FORGOTTEN_WHERE
from webapp.web.auth import admin_required

CREATING = ("memory_create", "memory_refinement_consolidate_create")
PROMOTING = "memory_promote"
# Deleted by a person: an admin in the ledger, or anyone forgetting on a chat's memory page (via FORGOTTEN_VIA).
DELETING = "memory_delete"


@dataclass
class ChatLabel:
    """A chat as an admin page names it: by title and link when the admin may read it, else by its people."""

    chat: Chat
    people: list[str]  # display names, in the order they joined
    title: str | None  # the title this admin may see (access.ChatNames): None for someone else's private chat

    @property
    def readable(self) -> bool:
        return self.title is not None

    @property
    def whose(self) -> str:
        """ "Dana's chat", "Dana and Sam's chat", "Dana, Sam and Lee's chat" (or "a chat with no one")."""
        if not self.people:
            return "a chat with no one"
        names = (
            self.people[0]
            if len(self.people) == 1
            else f"{', '.join(self.people[:-1])} and {self.people[-1]}"
        )
        return f"{names}'s chat"


@dataclass
class Origin:
    via: str
    data: dict[str, Any]
    session_id: str | None = None
    user_email: str | None = None
    chat: ChatLabel | None = None
    promoted_session_id: str | None = None


def provenance(memories: list[AgentMemory]) -> dict[str, Any]:
    """What a page of memories shows of where each came from, who hears it and who deleted it: `origins` by memory
    id, `chats` (the chats they came from, as ChatLabels) by chat id, `deleted_by` (Deletion) by memory id, and
    the turns each came from that the admin may read (`sources`). Six queries for any page of them."""
    origins, deleted_by = origins_for(memories)
    readable = sa.select(Chat.id).where(readable_chats(current_user))
    return {
        "origins": origins,
        "chats": _chats_of(origins, memories),
        "deleted_by": deleted_by,
        "sources": search.source_turns([m.id for m in memories], readable),
    }


def _chats_of(origins: dict[int, "Origin"], memories: list[AgentMemory]) -> dict[int, ChatLabel]:
    wanted = {o.data.get("chat_id") for o in origins.values()} | {m.chat_id for m in memories}
    chats = chat_labels(wanted - {None})
    for origin in origins.values():
        origin.chat = chats.get(origin.data.get("chat_id"))
    return chats


@dataclass
class Deletion:
    """The person whose delete keeps a memory deleted now; `forgotten`: where they forgot it (None: deleted in
    the ledger)."""

    name: str
    email: str
    forgotten: str | None


def origins_for(memories: list[AgentMemory]) -> tuple[dict[int, Origin], dict[int, Deletion]]:
    """The origin of each memory (absent when it predates audit rows), its chat not yet named (provenance
    does), and for each deleted one the person who deleted it (absent when a job did): one query for any page."""
    ids = [m.id for m in memories]
    if not ids:
        return {}, {}
    rows = db.session.execute(
        sa.select(AuditLog, User)
        .outerjoin(User, User.id == AuditLog.user_id)
        .where(
            AuditLog.account_id == current_user.account_id,
            AuditLog.auditable_type == "AgentMemory",
            AuditLog.auditable_id.in_(ids),
            AuditLog.action.in_((*CREATING, PROMOTING, DELETING)),
        )
        .order_by(AuditLog.id)
    ).all()
    origins: dict[int, Origin] = {}
    for row, user in rows:
        if row.action in CREATING and row.auditable_id not in origins:
            email = user.email if user else None
            origins[row.auditable_id] = Origin(row.data.get("via", ""), row.data, row.session_id, email)
    for row, _user in rows:
        if row.action == PROMOTING and row.auditable_id in origins:
            origins[row.auditable_id].promoted_session_id = row.session_id or ""
    deleted_at = {m.id: m.snapshot()["deleted_at"] for m in memories if m.is_deleted}
    deleted_by = {
        row.auditable_id: Deletion(user.display_name, user.email, FORGOTTEN_WHERE.get(row.data.get("via")))
        for row, user in rows
        if row.action == DELETING
        and user
        and row.data["after"]["deleted_at"] == deleted_at.get(row.auditable_id)
    }
    return origins, deleted_by


def chat_labels(ids: set[int]) -> dict[int, ChatLabel]:
    """The account's chats with these ids as the signed-in admin may see them named (three queries)."""
    if not ids:
        return {}
    chats = db.session.scalars(
        sa.select(Chat).where(Chat.id.in_(ids), Chat.account_id == current_user.account_id)
    ).all()
    if not chats:
        return {}
    found = [chat.id for chat in chats]
    names = ChatNames.among(current_user, found)
    people: dict[int, list[str]] = {chat_id: [] for chat_id in found}
    for chat_id, person in db.session.execute(
        sa.select(ChatPerson.chat_id, User)
        .join(User, User.id == ChatPerson.user_id)
        .where(ChatPerson.chat_id.in_(found))
        .order_by(ChatPerson.created_at, User.id)
    ):
        people[chat_id].append(person.display_name)
    return {chat.id: ChatLabel(chat, people[chat.id], names.title(chat)) for chat in chats}


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
        "memories/_reply_sources.html",
        sources=sources,
        memories=memories,
        chats=chat_labels(chat_ids - {None}),
    )
