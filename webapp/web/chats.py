"""Chats: the list, creating and governing chats, the chat page, sending messages, triggers and live replies."""

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    redirect,
    render_template,
    request,
    stream_with_context,
    url_for,
)
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from sqlalchemy.orm import joinedload, selectinload
from wtforms import SelectMultipleField, StringField, TextAreaField, widgets
from wtforms.validators import DataRequired, Length, ValidationError

from webapp import events
from webapp.extensions import db
from webapp.jobs.followups import after_new_message
from webapp.jobs.replies import request_replies, retry_refusal, retry_reply, stop_reply
from webapp.models import Agent, AuditLog, Chat, ChatAgent, Message
from webapp.models.chats import other_conversations
from webapp.prompting.build import prompt_memory
from webapp.timeutil import utcnow
from webapp.web.auth import owned_or_404
from webapp.web.fragments import fragment_requested, page_or_fragment
from webapp.web.guards import replies_limit
from webapp.web.markdown import render_markdown

bp = Blueprint("chats", __name__, url_prefix="/chats")

STUCK_AFTER = timedelta(minutes=10)  # a reply this long unfinished lost its worker; offer a retry
STREAM_SECONDS = 300  # browsers reconnect after this, so no connection lives forever
MEMORY_DOC_MAX_CHARS = 100_000


class ChatForm(FlaskForm):
    title = StringField("Title", validators=[Length(max=200)])
    agent_ids = SelectMultipleField(
        "Agents",
        coerce=int,
        validators=[DataRequired(message="Choose at least one agent.")],
        widget=widgets.ListWidget(prefix_label=False),
        option_widget=widgets.CheckboxInput(),
    )


class MessageForm(FlaskForm):
    content = TextAreaField("Message")

    def validate_content(self, field) -> None:
        text = (field.data or "").strip()
        limit = current_app.config["MESSAGE_MAX_CHARS"]
        if not text:
            raise ValidationError("Write a message first.")
        if len(text) > limit:
            raise ValidationError(f"That message has {len(text):,} characters; the limit is {limit:,}.")


SIDEBAR_CHATS = 50  # the chats listed beside a conversation, most recently active first
PREVIEW_CHARS = 90


@dataclass
class ChatRow:
    """A chat as the lists show it: the chat and its last finished message, if any."""

    chat: Chat
    last: Message | None

    @property
    def preview(self) -> str:
        if self.last is None:
            return "No messages yet"
        who = f"{self.last.author_name}: " if self.last.role == "assistant" else ""
        return who + " ".join(self.last.excerpt(PREVIEW_CHARS).split())


def _chat_rows(discarded: bool = False, limit: int | None = None) -> list[ChatRow]:
    """The account's chats, most recently active first, each with its last finished message (two queries)."""
    query = (
        sa.select(Chat)
        .options(selectinload(Chat.agents))
        .where(Chat.account_id == current_user.account_id)
        .where(Chat.discarded_at.is_not(None) if discarded else Chat.discarded_at.is_(None))
        .order_by(Chat.last_message_at.desc(), Chat.id.desc())
        .limit(limit)
    )
    chats = db.session.scalars(query).all()
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
    return [ChatRow(c, by_chat.get(c.id)) for c in chats]


def _account_agents() -> list[Agent]:
    return db.session.scalars(
        sa.select(Agent).where(Agent.account_id == current_user.account_id).order_by(Agent.name)
    ).all()


@bp.get("/")
@login_required
def index() -> ResponseReturnValue:
    """The account's chats, most recently active first (or the discarded ones)."""
    discarded = request.args.get("discarded") == "1"
    rows = _chat_rows(discarded)
    has_agents = bool(_account_agents())
    return page_or_fragment(
        "chats/index.html",
        {"chat-list": "chats/_list.html"},
        rows=rows,
        discarded=discarded,
        has_agents=has_agents,
    )


@bp.route("/new", methods=["GET", "POST"])
@login_required
def new() -> ResponseReturnValue:
    """Start a chat with one agent (it answers every message) or several (they answer when asked)."""
    form = ChatForm()
    form.agent_ids.choices = [(a.id, a.name) for a in _account_agents()]
    if request.method == "GET":
        preselected = request.args.get("agent", type=int)
        form.agent_ids.data = (
            [preselected]
            if preselected
            else ([form.agent_ids.choices[0][0]] if len(form.agent_ids.choices) == 1 else [])
        )
    if form.validate_on_submit():
        chosen = [a for a in _account_agents() if a.id in form.agent_ids.data]
        chat = Chat(account_id=current_user.account_id, title=(form.title.data or "").strip())
        chat.manual_responses = len(chosen) > 1
        chat.chat_agents = [ChatAgent(agent=agent) for agent in chosen]
        db.session.add(chat)
        db.session.commit()
        return redirect(url_for("chats.show", chat_id=chat.id), code=303)
    return render_template("chats/new.html", form=form), 422 if form.errors else 200


def _page_of_messages(chat: Chat, before: int | None) -> tuple[list[Message], bool]:
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
    return newest_first[:per_page][::-1], len(newest_first) > per_page


@bp.get("/<int:chat_id>")
@login_required
def show(chat_id: int) -> ResponseReturnValue:
    """The chat page: the latest messages, the composer, the trigger bar and the agents' other conversations."""
    chat = owned_or_404(Chat, chat_id)
    if fragment_requested("cross-conversations"):
        context = dict(chat=chat, **_panel(chat))
    elif fragment_requested("side-list"):
        context = dict(chat=chat, sidebar=_chat_rows(limit=SIDEBAR_CHATS))
    else:
        messages, has_older = _page_of_messages(chat, None)
        context = dict(
            chat=chat, messages=messages, has_older=has_older, form=MessageForm(), stuck_after=STUCK_AFTER
        )
        if not fragment_requested("messages"):
            in_chat = {a.id for a in chat.agents}
            addable = [a for a in _account_agents() if a.id not in in_chat]
            context.update(addable=addable, sidebar=_chat_rows(limit=SIDEBAR_CHATS), **_panel(chat))
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
    query = other_conversations(current_user.account_id, [m.agent_id for m in memberships], chat.id)
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
    chat = owned_or_404(Chat, chat_id)
    messages, has_older = _page_of_messages(chat, request.args.get("before", type=int))
    return render_template(
        "chats/_page.html", chat=chat, messages=messages, has_older=has_older, stuck_after=STUCK_AFTER
    )


@bp.get("/<int:chat_id>/messages/<int:message_id>")
@login_required
def message(chat_id: int, message_id: int) -> ResponseReturnValue:
    """One message; with ?shown=STATUS a 204 while it is still in the state the page shows, so an unfinished
    reply's page catches up on a change whose live event it missed (one sent before the reply was on the page,
    or while its stream was reconnecting)."""
    chat = owned_or_404(Chat, chat_id)
    found = _message_in(chat, message_id)
    if request.args.get("shown") == found.status:
        return "", 204
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)


def _message_in(chat: Chat, message_id: int) -> Message:
    found = db.session.scalar(sa.select(Message).where(Message.id == message_id, Message.chat_id == chat.id))
    if found is None:
        abort(404)
    return found


@bp.post("/<int:chat_id>/messages")
@login_required
@replies_limit
def send(chat_id: int) -> ResponseReturnValue:
    """Post a message; the single agent of a one-to-one chat, each @mentioned agent, and the agent of the Ask
    button pressed (ask=ID or ask=all) are asked to reply. Ask with an empty draft only asks."""
    chat = _open_chat(chat_id)
    form = MessageForm()
    ask = request.form.get("ask", "")
    if ask and not (form.content.data or "").strip():
        return _ask(chat, ask)
    if not form.validate():
        return _composer_error(chat, form)
    content = form.content.data.strip()
    posted = chat.add_message(role="user", content=content, user=current_user, status="done")
    asked = _asked(chat, content, ask)
    replies = request_replies(chat, [a for a in asked if not a.paused])
    after_new_message(chat)
    db.session.commit()
    _announce_new(chat, [posted, *replies])
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
        return _notice("That agent is not in this chat.", 422)
    ready = [a for a in agents if not a.paused]
    if not ready:
        return _notice(f"{agents[0].name} is paused.", 422)
    replies = request_replies(chat, ready)
    db.session.commit()
    _announce_new(chat, replies)
    return render_template(
        "chats/_sent.html", chat=chat, messages=replies, form=None, stuck_after=STUCK_AFTER
    )


def _announce_new(chat: Chat, messages: list[Message]) -> None:
    """Tell the chat's other open pages about new messages, so other people's messages arrive live."""
    for posted in messages:
        events.publish(chat.id, "new", posted.id)


def _composer_error(chat: Chat, form: MessageForm):
    response = Response(render_template("chats/_composer.html", chat=chat, form=form), status=422)
    response.headers.update({"HX-Retarget": "#composer", "HX-Reswap": "outerHTML"})
    return response


@bp.post("/<int:chat_id>/trigger")
@login_required
@replies_limit
def trigger(chat_id: int) -> ResponseReturnValue:
    """Ask one agent of the chat (agent_id=ID) or all of them one after another (agent_id=all) to reply."""
    return _ask(_open_chat(chat_id), request.form.get("agent_id", ""))


def _notice(text: str, status: int):
    response = Response(render_template("_notice.html", text=text), status=status)
    response.headers.update({"HX-Retarget": "#notice", "HX-Reswap": "outerHTML"})
    return response


@bp.post("/<int:chat_id>/messages/<int:message_id>/retry")
@login_required
@replies_limit
def retry(chat_id: int, message_id: int) -> ResponseReturnValue:
    """Queue a failed (or stuck) reply again."""
    chat = _open_chat(chat_id)
    found = _message_in(chat, message_id)
    refusal = retry_refusal(found, stuck=found.updated_at < utcnow() - STUCK_AFTER)
    if refusal:
        return _notice(refusal, 422)
    retry_reply(found)
    db.session.commit()
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)


def _latest_id(chat: Chat) -> int | None:
    return db.session.scalar(sa.select(sa.func.max(Message.id)).where(Message.chat_id == chat.id))


@bp.post("/<int:chat_id>/messages/<int:message_id>/stop")
@login_required
def stop(chat_id: int, message_id: int) -> ResponseReturnValue:
    """Stop a reply being generated (it keeps what it wrote) or waiting for its turn."""
    chat = _open_chat(chat_id)
    found = _message_in(chat, message_id)
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
    chat = _open_chat(chat_id)
    found = _message_in(chat, message_id)
    if found.role != "assistant" or found.status != "done" or found.id != _latest_id(chat):
        return _notice("Only the last reply of the chat can be regenerated.", 422)
    if found.agent is None or found.agent.paused:
        return _notice("This agent is paused or gone; it cannot answer again.", 422)
    retry_reply(found)
    db.session.commit()
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)


def _editable(chat: Chat, message_id: int) -> Message:
    """Your own last message: after it come only agents' replies to it."""
    found = _message_in(chat, message_id)
    later_other = db.session.scalar(
        sa.select(sa.func.count(Message.id)).where(
            Message.chat_id == chat.id, Message.id > found.id, Message.role != "assistant"
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
    chat = _open_chat(chat_id)
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
        sa.select(Message).where(Message.chat_id == chat.id, Message.id > found.id).order_by(Message.id)
    ).all()
    answered = [r.agent for r in replies if r.agent is not None]
    for reply in replies:
        stop_reply(reply)
        db.session.delete(reply)
    found.content = form.content.data.strip()
    asked = answered or _asked(chat, found.content, "")
    new_replies = request_replies(chat, [a for a in asked if not a.paused])
    db.session.commit()
    _announce_new(chat, new_replies)
    return render_template(
        "chats/_edited.html",
        chat=chat,
        message=found,
        removed=replies,
        replies=new_replies,
        stuck_after=STUCK_AFTER,
    )


@bp.get("/<int:chat_id>/agents/<int:agent_id>/memory")
@login_required
def agent_memory(chat_id: int, agent_id: int) -> ResponseReturnValue:
    """What an agent of this chat remembers, read-only: the memories its next prompt in this chat holds (those
    that match the chat's latest messages, then its budget's worth of core memories and the journal of the last
    7 days) and how many did not fit. Members see what the agent's admin lets them (all of it, the core
    memories, or nothing); admins see all, with a link to the ledger."""
    chat = owned_or_404(Chat, chat_id)
    agent = next((a for a in chat.agents if a.id == agent_id), None)
    if agent is None:
        abort(404)
    shown = agent.memory_visible_to(current_user)
    held = prompt_memory(chat, agent, utcnow())[0].shown_as(shown)
    return render_template("chats/agent_memory.html", chat=chat, agent=agent, held=held, shown=shown)


@bp.post("/<int:chat_id>/rename")
@login_required
def rename(chat_id: int) -> ResponseReturnValue:
    """Rename the chat in place."""
    chat = owned_or_404(Chat, chat_id)
    title = request.form.get("title", "").strip()
    if len(title) > 200:
        return _notice("A title has at most 200 characters.", 422)
    chat.title = title
    db.session.commit()
    return render_template("chats/_title.html", chat=chat, renamed=True)


@bp.post("/<int:chat_id>/agents")
@login_required
def add_agent(chat_id: int) -> ResponseReturnValue:
    """Add an agent of the account to the chat; it becomes a group chat and a notice says who joined."""
    chat = _open_chat(chat_id)
    agent = owned_or_404(Agent, request.form.get("agent_id", type=int) or 0)
    if agent in chat.agents:
        return _notice(f"{agent.name} is already in this chat.", 422)
    chat.add_agent(agent)
    chat.manual_responses = True
    chat.add_message(role="system", content=f"{agent.name} joined the conversation.", status="done")
    db.session.commit()
    return redirect(url_for("chats.show", chat_id=chat.id), code=303)


@bp.route("/<int:chat_id>/memory-doc", methods=["GET", "POST"])
@login_required
def memory_doc(chat_id: int) -> ResponseReturnValue:
    """The chat's conversation summary (spec 004): read it; admins edit it, and each edit is audited."""
    chat = owned_or_404(Chat, chat_id)
    if request.method == "GET":
        editing = bool(request.args.get("edit")) and current_user.is_admin
        return render_template("chats/_memory_doc.html", chat=chat, editing=editing)
    if not current_user.is_admin:
        abort(403)
    text = request.form.get("memory_doc", "").strip()
    if len(text) > MEMORY_DOC_MAX_CHARS:
        error = f"The summary has {len(text):,} characters; the limit is {MEMORY_DOC_MAX_CHARS:,}."
        return render_template("chats/_memory_doc.html", chat=chat, editing=True, error=error), 422
    AuditLog.record(
        "chat_memory_doc_update", chat, account_id=chat.account_id, user_id=current_user.id,
        before={"memory_doc": chat.memory_doc}, after={"memory_doc": text}, via="admin",
    )  # fmt: skip
    chat.memory_doc = text
    db.session.commit()
    return render_template("chats/_memory_doc.html", chat=chat, editing=False)


@bp.post("/<int:chat_id>/discard")
@login_required
def discard(chat_id: int) -> ResponseReturnValue:
    """Discard the chat (it can be restored)."""
    chat = owned_or_404(Chat, chat_id)
    chat.discarded_at = utcnow()
    db.session.commit()
    return redirect(url_for("chats.index"), code=303)


@bp.post("/<int:chat_id>/restore")
@login_required
def restore(chat_id: int) -> ResponseReturnValue:
    """Bring a discarded chat back."""
    chat = owned_or_404(Chat, chat_id)
    chat.discarded_at = None
    db.session.commit()
    return redirect(url_for("chats.show", chat_id=chat.id), code=303)


def _open_chat(chat_id: int) -> Chat:
    chat = owned_or_404(Chat, chat_id)
    if chat.is_discarded:
        abort(409, "This chat is discarded; restore it to continue.")
    return chat


@bp.get("/<int:chat_id>/stream")
@login_required
def stream(chat_id: int) -> ResponseReturnValue:
    """Server-Sent Events for this chat: reply text as it streams, then each finished message."""
    chat = owned_or_404(Chat, chat_id)
    seconds = max(1.0, min(request.args.get("seconds", STREAM_SECONDS, type=float), STREAM_SECONDS))
    keepalive = current_app.config["STREAM_KEEPALIVE_SECONDS"]
    release_slot = events.take_stream_slot(
        current_user.id, current_app.config["STREAM_MAX_PER_USER"], seconds
    )
    if release_slot is None:
        return Response("Too many open live streams; close another tab of Cairn.", status=429)
    db.session.close()  # hold no database connection while waiting for events

    def generate():
        yield ": connected\n\n"
        streamed: dict[int, str] = {}  # each reply's text since its last "final" event
        for event in events.listen(chat.id, seconds, keepalive):
            if event is None:
                yield ": keepalive\n\n"
            elif event["kind"] == "delta":
                text = streamed.get(event["message_id"], "") + event["text"]
                streamed[event["message_id"]] = text
                yield events.sse(f"delta-{event['message_id']}", str(render_markdown(text)))
            elif event["kind"] == "new":
                yield events.sse("message", _render_final(chat, event["message_id"]))
            else:
                streamed.pop(event["message_id"], None)
                yield events.sse(f"final-{event['message_id']}", _render_final(chat, event["message_id"]))

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    response = Response(stream_with_context(generate()), mimetype="text/event-stream", headers=headers)
    # Closed when the time is up or the browser has left (the server's next write fails): free the slot.
    response.call_on_close(release_slot)
    return response


def _render_final(chat: Chat, message_id: int) -> str:
    found = db.session.get(Message, message_id)  # a fresh transaction: sees what the worker just committed
    if found is None or found.chat_id != chat.id:
        db.session.close()
        return ""
    html = render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)
    db.session.close()  # hold no database connection while waiting for the next event
    return html
