"""What the chat pages share: the blueprint, the composer's form, and a chat found for a request (readable,
open, governed) or a 404, 403 or 409."""

from datetime import timedelta

import sqlalchemy as sa
from flask import Blueprint, abort, current_app, flash, redirect, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user
from flask_wtf import FlaskForm
from wtforms import TextAreaField
from wtforms.validators import ValidationError

from webapp.actions.ask import announce_new
from webapp.extensions import db
from webapp.jobs.replies import WAITING
from webapp.models import Agent, Chat, ChatPerson, Message, access
from webapp.web.auth import readable_chat_or_404

bp = Blueprint("chats", __name__, url_prefix="/chats")


STUCK_AFTER = timedelta(minutes=10)  # a reply this long unfinished lost its worker; offer a retry


class MessageForm(FlaskForm):
    content = TextAreaField("Message")

    def validate_content(self, field) -> None:
        text = (field.data or "").strip()
        limit = current_app.config["MESSAGE_MAX_CHARS"]
        if not text:
            raise ValidationError("Write a message first.")
        if len(text) > limit:
            raise ValidationError(f"That message has {len(text):,} characters; the limit is {limit:,}.")


def open_chat(chat_id: int) -> Chat:
    chat = readable_chat_or_404(chat_id)
    if chat.is_discarded:
        abort(409, "This chat is discarded; restore it to continue.")
    return chat


def governed_chat(chat_id: int) -> Chat:
    """A chat the person may read and govern (access.may_govern), else 404 or 403."""
    chat = readable_chat_or_404(chat_id)
    if not access.may_govern(chat, current_user):
        abort(403)
    return chat


def chat_agent_or_404(chat: Chat, agent_id: int) -> Agent:
    """The agent of this chat with this id; any other is a 404."""
    agent = next((a for a in chat.agents if a.id == agent_id), None)
    if agent is None:
        abort(404)
    return agent


def account_agents() -> list[Agent]:
    return db.session.scalars(
        sa.select(Agent).where(Agent.account_id == current_user.account_id).order_by(Agent.name)
    ).all()


def message_in(chat: Chat, message_id: int) -> Message:
    found = db.session.scalar(sa.select(Message).where(Message.id == message_id, Message.chat_id == chat.id))
    if found is None:
        abort(404)
    return found


def governed(chat: Chat, *, join: bool = True) -> list[int]:
    """The ids of the chat's people, if the signed-in person is one of them (else a 403): they may share the chat,
    make it private and add or take out people. A chat from before chats had people has none, and everyone of
    the account reads it: only an admin governs it (a member could otherwise hide it from all the others), and
    becomes its person (with `join`), so making it private never hides it from them too."""
    people = access.people_of(chat)
    if not access.governs(people, current_user) or not (people or join):
        abort(403)
    if not people:
        db.session.add(ChatPerson(chat_id=chat.id, user_id=current_user.id, added_by_id=current_user.id))
        return [current_user.id]
    return people


def not_widened(chat: Chat, people: list[int] | None, who_may_not: str) -> str | None:
    """Why the chat may not be opened to `people` (None: everyone of the account), in words; None if it may. A
    reply being written may still draw on whatever is heard now, so the chat waits for it."""
    if db.session.scalar(
        sa.select(sa.exists().where(Message.chat_id == chat.id, Message.status.in_(WAITING)))
    ):
        return "a reply is still being written here; try again once it is done."
    if closed := access.sources_closed_to(chat, people):
        return f"its replies drew on {access.named_for(closed, current_user)}, which {who_may_not}."
    return None


def back_to(
    chat: Chat, said: str, announced: str | None = None, *, to: str | None = None
) -> ResponseReturnValue:
    """Commit a change to the chat's people or visibility, `announced` in the chat; back to the chat (or `to`)."""
    posted = chat.add_message(role="system", content=announced, status="done") if announced else None
    db.session.commit()
    if posted:
        announce_new(chat, [posted])
    flash(said)
    return redirect(to or url_for("chats.show", chat_id=chat.id), code=303)
