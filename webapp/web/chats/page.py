"""The chat page: its messages a page at a time, the agents' other conversations, and which other chats a
message may name for the viewer (may_open_chat)."""

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from flask import current_app, g, render_template, request
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required
from sqlalchemy.orm import joinedload

from webapp.actions import temporary_chats
from webapp.extensions import db
from webapp.models import Chat, ChatAgent, Message, access
from webapp.models.chats import other_conversations
from webapp.timeutil import utcnow
from webapp.tools.steps import UNNAMED_CHIP
from webapp.web.auth import readable_chat_or_404
from webapp.web.chats.common import STUCK_AFTER, MessageForm, account_agents, bp, message_in
from webapp.web.chats.listing import SIDEBAR_CHATS, chat_rows
from webapp.web.chats.people import people_panel
from webapp.web.fragments import fragment_requested, page_or_fragment


def page_of_messages(chat: Chat, before: int | None) -> tuple[list[Message], bool]:
    """One page of messages, oldest first, and whether older ones exist."""
    per_page = current_app.config["MESSAGES_PER_PAGE"]
    query = (
        sa.select(Message)
        .options(joinedload(Message.user), joinedload(Message.agent))
        .where(Message.chat_id == chat.id)
        .order_by(Message.id.desc())
        .limit(per_page + 1)
    )
    if before is not None:
        query = query.where(Message.id < before)
    newest_first = db.session.scalars(query).all()
    _learn_which_chats_readable(newest_first)
    return newest_first[:per_page][::-1], len(newest_first) > per_page


def _chats_mentioned(message: Message) -> set[int]:
    """The other chats a message names or links: its borrowed-context chip and its reply's sources."""
    ids = {step.get("chat_id") for step in message.tools_used or [] if isinstance(step, dict)}
    if message.sources is not None:
        sources = message.sources
        ids |= {*sources.summary_chat_ids, *sources.recalled_chat_ids, sources.borrowed_chat_id}
    return {i for i in ids if isinstance(i, int)}


@bp.before_app_request
def forget_which_chats_readable() -> None:
    """What the viewer may read is learnt afresh by each request (and before each event of a stream)."""
    g.pop("readable_mentioned", None)


def _learn_which_chats_readable(messages: Iterable[Message]) -> None:
    """Find out in one query which of the chats these messages mention the person may read (may_open_chat)."""
    known = g.setdefault("readable_mentioned", {})
    unknown = set().union(*(_chats_mentioned(m) for m in messages)) - known.keys()
    readable = access.readable_among(current_user, unknown)
    known.update({chat_id: chat_id in readable for chat_id in unknown})


bp.add_app_template_global(UNNAMED_CHIP, "unnamed_chip")  # a chip's words for a chat the viewer may not read


@bp.app_template_global()
def may_open_chat(chat_id: int) -> bool:
    """Whether a message may name and link another chat it mentions: only one the viewer may read."""
    known = g.setdefault("readable_mentioned", {})
    if chat_id not in known:
        known[chat_id] = bool(access.readable_among(current_user, [chat_id]))
    return known[chat_id]


@bp.get("/<int:chat_id>")
@login_required
def show(chat_id: int) -> ResponseReturnValue:
    """The chat page: the latest messages, the composer, the trigger bar and the agents' other conversations."""
    chat = readable_chat_or_404(chat_id)
    if fragment_requested("cross-conversations"):
        context = dict(chat=chat, **_panel(chat))
    elif fragment_requested("side-list"):
        context = dict(chat=chat, sidebar=chat_rows(limit=SIDEBAR_CHATS))
    else:
        messages, has_older = page_of_messages(chat, None)
        context = dict(
            chat=chat, messages=messages, has_older=has_older, form=MessageForm(), stuck_after=STUCK_AFTER
        )
        if not fragment_requested("messages"):
            in_chat = {a.id for a in chat.agents}
            addable = [a for a in account_agents() if a.id not in in_chat]
            context.update(addable=addable, sidebar=chat_rows(limit=SIDEBAR_CHATS), **_panel(chat))
            context.update(people_panel(chat), expires_in=_expires_in(chat))
    fragments = {
        "cross-conversations": "chats/_cross_conversations.html",
        "messages": "chats/_messages.html",
        "side-list": "chats/_side_list.html",
    }
    response = page_or_fragment("chats/show.html", fragments, **context)
    response.headers["Cache-Control"] = (
        "no-store"  # Back to a chat shows it as it is now, not as first loaded
    )
    return response


def _expires_in(chat: Chat) -> str | None:
    """For a temporary chat whose starter set their chats to be deleted: after how long ("7 days")."""
    days = None if chat.remembers else temporary_chats.days_kept(chat)
    return None if days is None else f"{days} day{'s' if days != 1 else ''}"


@dataclass
class AgentOutlook:
    """One agent of the chat as the cross-conversation panel shows it."""

    membership: ChatAgent  # this chat's row: the agent's summary of it and any borrowed context waiting
    others: list[ChatAgent]  # its summaries of its other active chats, most recently updated first


def _panel(chat: Chat) -> dict:
    """For each agent of the chat, its other active conversations in this account (two queries in all)."""
    memberships = db.session.scalars(
        sa.select(ChatAgent)
        .options(joinedload(ChatAgent.agent))
        .where(ChatAgent.chat_id == chat.id)
        .order_by(ChatAgent.id)
    ).all()
    others = defaultdict(list)
    # The summaries this chat's prompts may hold (everyone present may read their chats), and only chats the
    # viewer may read: in the query, never filtered after its per-agent limit.
    heard = sa.and_(access.chats_heard_in(chat), access.readable_chats(current_user))
    query = other_conversations(
        current_user.account_id, [m.agent_id for m in memberships], chat.id, heard=heard
    )
    for row in db.session.scalars(query):
        others[row.agent_id].append(row)
    outlooks = [AgentOutlook(m, others[m.agent_id]) for m in memberships]
    refresh = current_app.config["CROSS_CONVERSATION_REFRESH_SECONDS"]
    return {"outlooks": outlooks, "panel_refresh_seconds": refresh}


@bp.app_template_filter("ago")
def ago(moment: datetime) -> str:
    """How long ago a (naive UTC) moment was, in words."""
    minutes = max(0, int((utcnow() - moment).total_seconds() // 60))
    for unit, size in (("day", 1440), ("hour", 60), ("minute", 1)):
        if minutes >= size:
            count = minutes // size
            return f"{count} {unit}{'' if count == 1 else 's'} ago"
    return "just now"


@bp.get("/<int:chat_id>/messages")
@login_required
def older(chat_id: int) -> ResponseReturnValue:
    """The page of messages before ?before=ID, for "Load older messages"."""
    chat = readable_chat_or_404(chat_id)
    messages, has_older = page_of_messages(chat, request.args.get("before", type=int))
    return render_template(
        "chats/_page.html", chat=chat, messages=messages, has_older=has_older, stuck_after=STUCK_AFTER
    )


@bp.get("/<int:chat_id>/messages/<int:message_id>")
@login_required
def message(chat_id: int, message_id: int) -> ResponseReturnValue:
    """One message; with ?shown=STATUS a 204 while it is still in the state the page shows, so an unfinished
    reply's page catches up on a change whose live event it missed (one sent before the reply was on the page,
    or while its stream was reconnecting)."""
    chat = readable_chat_or_404(chat_id)
    found = message_in(chat, message_id)
    if request.args.get("shown") == found.status:
        return "", 204
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)
