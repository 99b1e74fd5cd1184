"""The list of chats a person may read (or those discarded or hidden from it), and starting a chat."""

from dataclasses import dataclass

import sqlalchemy as sa
from flask import redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from sqlalchemy.orm import joinedload, selectinload
from wtforms import BooleanField, SelectMultipleField, StringField, widgets
from wtforms.validators import DataRequired, Length

from webapp.extensions import db
from webapp.models import Chat, ChatHidden, Message, access
from webapp.web import model_picker
from webapp.web.chats.common import account_agents, bp
from webapp.web.fragments import page_or_fragment
from webapp.web.markdown import plain_text


class ChatForm(FlaskForm):
    title = StringField("Title", validators=[Length(max=200)])
    agent_ids = SelectMultipleField(
        "Agents",
        coerce=int,
        validators=[DataRequired(message="Choose at least one agent.")],
        widget=widgets.ListWidget(prefix_label=False),
        option_widget=widgets.CheckboxInput(),
    )
    temporary = BooleanField(
        "Nothing from this chat is remembered",
        description="A temporary chat: agents make no memories or summaries of it, no other chat reads it, and "
        "you can delete it for good.",
    )


SIDEBAR_CHATS = 50  # the chats listed beside a conversation, most recently active first


PREVIEW_CHARS = 90


@dataclass
class ChatRow:
    """A chat as the lists show it: the chat and its last finished message, if any."""

    chat: Chat
    last: Message | None
    hidden: bool = False  # the person took it out of their own list
    # The person may restore it (webapp.models.access.may_govern); asked of discarded chats only.
    governed: bool = False

    @property
    def preview(self) -> str:
        if self.last is None:
            return "No messages yet"
        who = f"{self.last.author_name}: " if self.last.role == "assistant" else ""
        return who + plain_text(self.last.content, PREVIEW_CHARS)


def chat_rows(discarded: bool = False, limit: int | None = None) -> list[ChatRow]:
    """The chats the person may read, most recently active first (or those discarded or hidden from their list),
    each with its last finished message: two queries, and a third for which discarded ones they may restore."""
    hidden = sa.exists().where(ChatHidden.chat_id == Chat.id, ChatHidden.user_id == current_user.id)
    query = (
        sa.select(Chat, hidden)
        .options(selectinload(Chat.agents), selectinload(Chat.discarded_by))
        .where(access.readable_chats(current_user))
        .where(
            sa.or_(Chat.discarded_at.is_not(None), hidden)
            if discarded
            else sa.and_(Chat.discarded_at.is_(None), ~hidden)
        )
        .order_by(Chat.last_message_at.desc(), Chat.id.desc())
        .limit(limit)
    )
    found = db.session.execute(query).all()
    chats, hidden_ids = [chat for chat, _ in found], {chat.id for chat, hid in found if hid}
    last_ids = (
        sa.select(sa.func.max(Message.id))
        .where(
            Message.chat_id.in_([c.id for c in chats]),
            Message.role.in_(("user", "assistant")),
            Message.status == "done",
        )
        .group_by(Message.chat_id)
    )
    lasts = db.session.scalars(
        sa.select(Message)
        .options(joinedload(Message.user), joinedload(Message.agent))
        .where(Message.id.in_(last_ids))
    ).all()
    by_chat = {m.chat_id: m for m in lasts}
    governed = access.governed_among(current_user, [c.id for c in chats if c.is_discarded])
    return [ChatRow(c, by_chat.get(c.id), c.id in hidden_ids, c.id in governed) for c in chats]


@bp.get("/")
@login_required
def index() -> ResponseReturnValue:
    """The chats the person may read, most recently active first (or the discarded ones)."""
    discarded = request.args.get("discarded") == "1"
    rows = chat_rows(discarded)
    agents = account_agents()
    return page_or_fragment(
        "chats/index.html",
        {"chat-list": "chats/_list.html"},
        rows=rows,
        discarded=discarded,
        has_agents=bool(agents),
        on_bundled_model=model_picker.on_bundled_model(agents) if current_user.is_admin else [],
        detected_ollama=model_picker.detected_ollama(current_user.account_id)
        if current_user.is_admin
        else None,
    )


@bp.route("/new", methods=["GET", "POST"])
@login_required
def new() -> ResponseReturnValue:
    """Start a chat with one agent (it answers every message) or several (they answer when asked); it is private
    to whoever started it until they share it or add people."""
    form = ChatForm()
    form.agent_ids.choices = [(a.id, a.name) for a in account_agents()]
    if request.method == "GET":
        preselected = request.args.get("agent", type=int)
        form.agent_ids.data = (
            [preselected]
            if preselected
            else ([form.agent_ids.choices[0][0]] if len(form.agent_ids.choices) == 1 else [])
        )
    if form.validate_on_submit():
        chosen = [a for a in account_agents() if a.id in form.agent_ids.data]
        title = (form.title.data or "").strip()
        chat = Chat.start(current_user, chosen, title=title, remembers=not form.temporary.data)
        db.session.commit()
        return redirect(url_for("chats.show", chat_id=chat.id), code=303)
    return render_template("chats/new.html", form=form), 422 if form.errors else 200
