"""What agents remember of me (issue 42): every memory drawn from a chat the signed-in person is one of the
people of, grouped by agent, newest first, with the turns it was drawn from and who hears it; Forget one, forget
all from one chat, or forget everything (webapp.actions.forgetting, audited as them, undone by an admin)."""

from collections import defaultdict

import sqlalchemy as sa
from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from wtforms import SelectField
from wtforms.fields.choices import SelectChoice

from webapp.actions import forgetting
from webapp.actions.temporary_chats import KEEP_DAYS
from webapp.extensions import db
from webapp.models import AgentMemory, Chat, MemorySource, Message
from webapp.models.access import chats_of_person, readable_chats

bp = Blueprint("remembered", __name__, url_prefix="/account/memories")
PAGE_SIZE = 50


class TemporaryChatsForm(FlaskForm):
    days = SelectField(
        "Delete the temporary chats I start",
        choices=[SelectChoice("", "never: I delete them myself")]
        + [
            SelectChoice(str(d), f"{d} day{'s' if d != 1 else ''} after their last message")
            for d in KEEP_DAYS
        ],
    )


@bp.get("")
@login_required
def index() -> ResponseReturnValue:
    chat = _own_chat_or_404(request.args.get("chat", type=int))
    page = max(request.args.get("page", 1, type=int), 1)
    memories = db.session.scalars(
        forgetting.listed(current_user, chat.id if chat else None)
        .limit(PAGE_SIZE + 1)
        .offset((page - 1) * PAGE_SIZE)
    ).all()
    more, memories = len(memories) > PAGE_SIZE, memories[:PAGE_SIZE]
    return render_template(
        "remembered/index.html",
        memories=memories,
        by_agent=_by_agent(memories),
        sources=_sources(memories),
        audiences=_audience_chats(memories),
        chats=_own_chats(),
        chat=chat,
        page=page,
        more=more,
        total=forgetting.count(current_user, chat.id if chat else None),
        temporary_form=TemporaryChatsForm(formdata=None, days=str(current_user.temporary_chat_days or "")),
    )


@bp.post("/temporary-chats")
@login_required
def temporary_chats() -> ResponseReturnValue:
    """The person's setting: delete the temporary chats they start some days after their last message."""
    form = TemporaryChatsForm()
    if not form.validate_on_submit():
        abort(400)
    current_user.temporary_chat_days = int(form.days.data) if form.days.data else None
    db.session.commit()
    days = current_user.temporary_chat_days
    flash(
        f"Your temporary chats are deleted for good {days} day{'s' if days != 1 else ''} after their last message."
        if days
        else "Your temporary chats are kept until you delete them."
    )
    return redirect(url_for("remembered.index", _anchor="temporary-chats"), code=303)


@bp.post("/<int:memory_id>/forget")
@login_required
def forget(memory_id: int) -> ResponseReturnValue:
    try:
        memory = forgetting.forget(current_user, memory_id, via="account")
    except forgetting.NotYours:
        abort(404)
    flash(f"Forgotten: {memory.agent.name} no longer brings “{memory.content[:80]}” to any reply.")
    return redirect(url_for("remembered.index", **_kept_filters()), code=303)


@bp.route("/forget-all", methods=["GET", "POST"])
@login_required
def forget_all() -> ResponseReturnValue:
    """Ask first, saying how many memories go; then forget them all (from one chat, with ?chat=)."""
    chat = _own_chat_or_404(request.values.get("chat", type=int))
    chat_id = chat.id if chat else None
    if request.method == "GET":
        return render_template(
            "remembered/forget_all.html", chat=chat, total=forgetting.count(current_user, chat_id)
        )
    forgotten = forgetting.forget_all(current_user, chat_id)
    kept = (
        f" {forgotten.kept_constitutional} constitutional ones are kept."
        if forgotten.kept_constitutional
        else ""
    )
    flash(f"Forgotten: {forgotten.count} memories{' from ' + chat.display_title if chat else ''}.{kept}")
    return redirect(url_for("remembered.index"), code=303)


def _own_chat_or_404(chat_id: int | None) -> Chat | None:
    """The chat named by ?chat=, if the person is one of its people and may read it; none asked, None."""
    if chat_id is None:
        return None
    chat = db.session.scalar(sa.select(Chat).where(Chat.id == chat_id, chats_of_person(current_user)))
    if chat is None:
        abort(404)
    return chat


def _own_chats() -> list[Chat]:
    return list(
        db.session.scalars(
            sa.select(Chat)
            .where(chats_of_person(current_user))
            .order_by(Chat.last_message_at.desc().nulls_last(), Chat.id.desc())
        )
    )


def _kept_filters() -> dict:
    return {key: request.args[key] for key in ("chat", "page") if request.args.get(key)}


def _by_agent(memories: list[AgentMemory]) -> dict:
    grouped = defaultdict(list)
    for memory in memories:
        grouped[memory.agent].append(memory)
    return grouped


def _sources(memories: list[AgentMemory]) -> dict[int, list[tuple[int, int]]]:
    """Each memory's source turns (message id, chat id) that the person may read, in one query."""
    found = defaultdict(list)
    if not memories:
        return found
    rows = db.session.execute(
        sa.select(MemorySource.memory_id, Message.id, Message.chat_id)
        .join(Message, Message.id == MemorySource.message_id)
        .where(
            MemorySource.memory_id.in_([m.id for m in memories]),
            Message.chat_id.in_(sa.select(Chat.id).where(readable_chats(current_user))),
        )
        .order_by(Message.id)
    )
    for memory_id, message_id, chat_id in rows:
        found[memory_id].append((message_id, chat_id))
    return found


def _audience_chats(memories: list[AgentMemory]) -> dict[int, Chat]:
    """The chats whose people alone hear these memories (each one the person may read: they hear it)."""
    ids = {m.chat_id for m in memories if m.audience == "chat" and m.chat_id}
    if not ids:
        return {}
    return {chat.id: chat for chat in db.session.scalars(sa.select(Chat).where(Chat.id.in_(ids)))}
