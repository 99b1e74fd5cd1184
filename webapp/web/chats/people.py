"""Who takes part in a chat: its people (the panel, adding and taking out) and its agents (adding one)."""

import sqlalchemy as sa
from flask import abort, redirect, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from wtforms import SelectField

from webapp.actions import narrowing
from webapp.extensions import db
from webapp.models import Agent, Chat, ChatPerson, User, access
from webapp.web.auth import owned_or_404, readable_chat_or_404
from webapp.web.chats.common import back_to, bp, governed, not_widened, open_chat
from webapp.web.guards import notice


class PersonForm(FlaskForm):
    user_id = SelectField("Add a person", coerce=int, validate_choice=True)


def people_panel(chat: Chat) -> dict:
    """The chat's people (who started it first), whether the viewer may govern the chat, and whom they may add
    (two queries)."""
    people = db.session.scalars(
        sa.select(User)
        .join(ChatPerson, ChatPerson.user_id == User.id)
        .where(ChatPerson.chat_id == chat.id)
        .order_by(ChatPerson.created_at, ChatPerson.user_id)
    ).all()
    governs = access.governs([p.id for p in people], current_user)
    addable = (
        [p for p in current_user.account.people_names() if p.id not in {q.id for q in people}]
        if governs
        else []
    )
    return {"people": people, "governs": governs, "addable_people": addable}


@bp.post("/<int:chat_id>/people")
@login_required
def add_person(chat_id: int) -> ResponseReturnValue:
    """Add one of the account's people (not a removed one) to the chat: they can read it, even while private;
    refused while its replies drew on a chat they may not read (access.sources_closed_to)."""
    chat = readable_chat_or_404(chat_id)
    people = governed(chat)
    form = PersonForm()
    form.user_id.choices = [(p.id, p.name) for p in current_user.account.people_names() if p.id not in people]
    if not form.validate():
        db.session.rollback()
        return back_to(chat, "That person cannot be added to this chat.")
    name = dict(form.user_id.choices)[form.user_id.data]
    if why := not_widened(chat, [*people, form.user_id.data], f"{name} may not read"):
        db.session.rollback()
        return back_to(chat, f"{name} was not added: {why} Start a new chat with them instead.")
    db.session.add(ChatPerson(chat_id=chat.id, user_id=form.user_id.data, added_by_id=current_user.id))
    announced = f"{current_user.display_name} added {name} to the conversation."
    return back_to(chat, f"{name} can read this chat now.", announced)


@bp.post("/<int:chat_id>/people/<int:user_id>/remove")
@login_required
def remove_person(chat_id: int, user_id: int) -> ResponseReturnValue:
    """Take a person out of the chat (or leave it): not whoever started it, and one person always stays."""
    chat = readable_chat_or_404(chat_id)
    people = governed(chat, join=False)
    if user_id not in people:
        abort(404)
    if user_id == chat.started_by_id:
        return back_to(chat, "Whoever started a chat stays in it.")
    if len(people) == 1:
        return back_to(chat, "A chat keeps at least one person.")
    person = db.session.get(User, user_id)
    db.session.delete(db.session.get(ChatPerson, (chat.id, user_id)))
    narrowing.narrow_to(chat, current_user._get_current_object())
    if user_id != current_user.id:
        announced = f"{current_user.display_name} took {person.display_name} out of the conversation."
        return back_to(chat, f"{person.display_name} is no longer one of this chat's people.", announced)
    gone = url_for("chats.index") if chat.is_private else None  # they may no longer read it
    return back_to(chat, f"You left “{chat.display_title}”.", f"{person.display_name} left.", to=gone)


@bp.post("/<int:chat_id>/agents")
@login_required
def add_agent(chat_id: int) -> ResponseReturnValue:
    """Add an agent of the account to the chat; it becomes a group chat and a notice says who joined."""
    chat = open_chat(chat_id)
    agent = owned_or_404(Agent, request.form.get("agent_id", type=int) or 0)
    if agent in chat.agents:
        return notice(f"{agent.name} is already in this chat.", 422)
    chat.add_agent(agent)
    chat.manual_responses = True
    chat.add_message(role="system", content=f"{agent.name} joined the conversation.", status="done")
    db.session.commit()
    return redirect(url_for("chats.show", chat_id=chat.id), code=303)
