"""Sending, asking, retrying, stopping, regenerating and editing messages: each asks the agents through
webapp.actions.ask, as /v1 does."""

import sqlalchemy as sa
from flask import Response, abort, render_template, request
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required

from webapp import events
from webapp.actions.ask import ask_agents, post_message
from webapp.extensions import db
from webapp.jobs.replies import retry_refusal, retry_reply, stop_reply
from webapp.limits import replies_limit
from webapp.models import Agent, Chat, Message
from webapp.timeutil import utcnow
from webapp.web.chats.common import STUCK_AFTER, MessageForm, bp, message_in, open_chat
from webapp.web.guards import notice


@bp.post("/<int:chat_id>/messages")
@login_required
@replies_limit
def send(chat_id: int) -> ResponseReturnValue:
    """Post a message; the single agent of a one-to-one chat, each @mentioned agent, and the agent of the Ask
    button pressed (ask=ID or ask=all) are asked to reply. Ask with an empty draft only asks."""
    chat = open_chat(chat_id)
    form = MessageForm()
    ask = request.form.get("ask", "")
    if ask and not (form.content.data or "").strip():
        return _ask(chat, ask)
    if not form.validate():
        return _composer_error(chat, form)
    content = form.content.data.strip()
    asked = _asked(chat, content, ask)
    posted, replies = post_message(chat, current_user, content, asked)
    return render_template(
        "chats/_sent.html",
        chat=chat,
        messages=[posted, *replies],
        form=None,
        nobody_asked=not asked,
        stuck_after=STUCK_AFTER,
    )


def _asked(chat: Chat, content: str, ask: str) -> list[Agent]:
    """Who answers a message: everyone in a one-to-one chat, else the @mentioned and the asked, in chat order
    for "all", mentions first otherwise."""
    if not chat.manual_responses:
        return list(chat.agents)
    if ask == "all":
        return list(chat.agents)
    asked = chat.mentioned_agents(content)
    pressed = [a for a in chat.agents if str(a.id) == ask and a not in asked]
    return asked + pressed


def _ask(chat: Chat, wanted: str):
    """Ask one agent of the chat (an id) or all of them one after another ("all") to reply."""
    agents = [a for a in chat.agents if wanted == "all" or str(a.id) == wanted]
    if not agents:
        return notice("That agent is not in this chat.", 422)
    ready = [a for a in agents if not a.paused]
    if not ready:
        return notice(f"{agents[0].name} is paused.", 422)
    replies = ask_agents(chat, ready)
    return render_template(
        "chats/_sent.html", chat=chat, messages=replies, form=None, stuck_after=STUCK_AFTER
    )


def _composer_error(chat: Chat, form: MessageForm):
    response = Response(render_template("chats/_composer.html", chat=chat, form=form), status=422)
    response.headers.update({"HX-Retarget": "#composer", "HX-Reswap": "outerHTML"})
    return response


@bp.post("/<int:chat_id>/trigger")
@login_required
@replies_limit
def trigger(chat_id: int) -> ResponseReturnValue:
    """Ask one agent of the chat (agent_id=ID) or all of them one after another (agent_id=all) to reply."""
    return _ask(open_chat(chat_id), request.form.get("agent_id", ""))


@bp.post("/<int:chat_id>/messages/<int:message_id>/retry")
@login_required
@replies_limit
def retry(chat_id: int, message_id: int) -> ResponseReturnValue:
    """Queue a failed (or stuck) reply again."""
    chat = open_chat(chat_id)
    found = message_in(chat, message_id)
    refusal = retry_refusal(found, stuck=found.updated_at < utcnow() - STUCK_AFTER)
    if refusal:
        return notice(refusal, 422)
    retry_reply(found)
    db.session.commit()
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)


def _latest_id(chat: Chat) -> int | None:
    """The chat's last turn: its latest message, a notice ("Ana added Ben to the conversation") aside."""
    return db.session.scalar(
        sa.select(sa.func.max(Message.id)).where(Message.chat_id == chat.id, Message.role != "system")
    )


@bp.post("/<int:chat_id>/messages/<int:message_id>/stop")
@login_required
def stop(chat_id: int, message_id: int) -> ResponseReturnValue:
    """Stop a reply being generated (it keeps what it wrote) or waiting for its turn."""
    chat = open_chat(chat_id)
    found = message_in(chat, message_id)
    if found.role == "assistant" and found.status in ("pending", "streaming"):
        stop_reply(found)
        db.session.commit()
        events.publish(chat.id, "final", found.id)
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)


@bp.post("/<int:chat_id>/messages/<int:message_id>/regenerate")
@login_required
@replies_limit
def regenerate(chat_id: int, message_id: int) -> ResponseReturnValue:
    """Generate the chat's last reply again, in place."""
    chat = open_chat(chat_id)
    found = message_in(chat, message_id)
    if found.role != "assistant" or found.status != "done" or found.id != _latest_id(chat):
        return notice("Only the last reply of the chat can be regenerated.", 422)
    if found.agent is None or found.agent.paused:
        return notice("This agent is paused or gone; it cannot answer again.", 422)
    retry_reply(found)
    db.session.commit()
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)


def _editable(chat: Chat, message_id: int) -> Message:
    """Your own last message: after it come only agents' replies to it (and notices, which are no turn)."""
    found = message_in(chat, message_id)
    later_other = db.session.scalar(
        sa.select(sa.func.count(Message.id)).where(
            Message.chat_id == chat.id, Message.id > found.id, Message.role.not_in(("assistant", "system"))
        )
    )
    if found.role != "user" or found.user_id != current_user.id or later_other:
        abort(409, "Only your own last message can be edited.")
    return found


@bp.route("/<int:chat_id>/messages/<int:message_id>/edit", methods=["GET", "POST"])
@login_required
@replies_limit
def edit_message(chat_id: int, message_id: int) -> ResponseReturnValue:
    """Edit your last message and send it again: its replies are replaced by new ones."""
    chat = open_chat(chat_id)
    found = _editable(chat, message_id)
    if request.method == "GET":
        return render_template("chats/_edit.html", chat=chat, message=found, content=found.content)
    form = MessageForm()
    if not form.validate():
        error = form.content.errors[0]
        html = render_template(
            "chats/_edit.html", chat=chat, message=found, content=form.content.data, error=error
        )
        return html, 422
    replies = db.session.scalars(
        sa.select(Message)
        .where(Message.chat_id == chat.id, Message.id > found.id, Message.role == "assistant")
        .order_by(Message.id)
    ).all()  # a notice among them stays: someone was added, whatever is said again
    answered = [r.agent for r in replies if r.agent is not None]
    for reply in replies:
        stop_reply(reply)
        db.session.delete(reply)
    found.content = form.content.data.strip()
    asked = answered or _asked(chat, found.content, "")
    new_replies = ask_agents(chat, [a for a in asked if not a.paused])
    return render_template(
        "chats/_edited.html",
        chat=chat,
        message=found,
        removed=replies,
        replies=new_replies,
        stuck_after=STUCK_AFTER,
    )
