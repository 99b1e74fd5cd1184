"""Chats: the list, creating and governing chats, the chat page, sending messages, triggers and live replies.

Every route that takes a chat or message id finds the chat with readable_chat_or_404 (webapp.models.access): a
chat the person may not read is a 404 and nothing changes. A new chat is private to whoever started it; its people
may share it with the account, make it private again and add the account's people to it.
"""

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from flask import (
    Blueprint,
    Response,
    abort,
    current_app,
    flash,
    g,
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
from wtforms import SelectField, SelectMultipleField, StringField, TextAreaField, widgets
from wtforms.validators import DataRequired, Length, ValidationError

from webapp import events, search
from webapp.actions.ask import announce_new, ask_agents, post_message
from webapp.extensions import db
from webapp.jobs.replies import WAITING, retry_refusal, retry_reply, stop_reply
from webapp.limits import replies_limit
from webapp.llm import targets
from webapp.models import (
    Agent,
    AgentMemory,
    AuditLog,
    Chat,
    ChatAgent,
    ChatHidden,
    ChatPerson,
    Message,
    User,
    access,
)
from webapp.models.audit import FORGOTTEN_VIA, record_change
from webapp.models.chats import CHAT_VISIBILITIES, other_conversations
from webapp.prompting.build import prompt_memory
from webapp.timeutil import utcnow
from webapp.tools.steps import UNNAMED_CHIP
from webapp.web import model_picker
from webapp.web.auth import owned_or_404, readable_chat_or_404
from webapp.web.fragments import fragment_requested, page_or_fragment
from webapp.web.guards import notice
from webapp.web.markdown import plain_text, render_markdown

bp = Blueprint("chats", __name__, url_prefix="/chats")

STUCK_AFTER = timedelta(minutes=10)  # a reply this long unfinished lost its worker; offer a retry
STREAM_SECONDS = 300  # browsers reconnect after this, so no connection lives forever
STREAM_RECHECK_SECONDS = 5  # an open stream asks again whether its person may still read the chat
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


class VisibilityForm(FlaskForm):
    visibility = SelectField("Who can read this chat", choices=CHAT_VISIBILITIES)


class PersonForm(FlaskForm):
    user_id = SelectField("Add a person", coerce=int, validate_choice=True)


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
    hidden: bool = False  # the person took it out of their own list
    # The person may restore it (webapp.models.access.may_govern); asked of discarded chats only.
    governed: bool = False

    @property
    def preview(self) -> str:
        if self.last is None:
            return "No messages yet"
        who = f"{self.last.author_name}: " if self.last.role == "assistant" else ""
        return who + plain_text(self.last.content, PREVIEW_CHARS)


def _chat_rows(discarded: bool = False, limit: int | None = None) -> list[ChatRow]:
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
    governed = _governed_among([c.id for c in chats if c.is_discarded])
    return [ChatRow(c, by_chat.get(c.id), c.id in hidden_ids, c.id in governed) for c in chats]


def _governed_among(chat_ids: list[int]) -> set[int]:
    """Those of these chats the person governs (access.may_govern): one query, none without ids."""
    if not chat_ids:
        return set()
    mine = sa.exists().where(ChatPerson.chat_id == Chat.id, ChatPerson.user_id == current_user.id)
    nobodys = ~sa.exists().where(
        ChatPerson.chat_id == Chat.id, ChatPerson.user_id == User.id, User.removed_at.is_(None)
    )
    governs = sa.or_(mine, nobodys) if current_user.is_admin else mine
    return set(db.session.scalars(sa.select(Chat.id).where(Chat.id.in_(chat_ids), governs)))


def _account_agents() -> list[Agent]:
    return db.session.scalars(
        sa.select(Agent).where(Agent.account_id == current_user.account_id).order_by(Agent.name)
    ).all()


@bp.get("/")
@login_required
def index() -> ResponseReturnValue:
    """The chats the person may read, most recently active first (or the discarded ones)."""
    discarded = request.args.get("discarded") == "1"
    rows = _chat_rows(discarded)
    agents = _account_agents()
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
        chat = Chat.start(current_user, chosen, title=(form.title.data or "").strip())
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
def _forget_which_chats_readable() -> None:
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
            context.update(_people_panel(chat))
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
    chat = readable_chat_or_404(chat_id)
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
    return _ask(_open_chat(chat_id), request.form.get("agent_id", ""))


@bp.post("/<int:chat_id>/messages/<int:message_id>/retry")
@login_required
@replies_limit
def retry(chat_id: int, message_id: int) -> ResponseReturnValue:
    """Queue a failed (or stuck) reply again."""
    chat = _open_chat(chat_id)
    found = _message_in(chat, message_id)
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
        return notice("Only the last reply of the chat can be regenerated.", 422)
    if found.agent is None or found.agent.paused:
        return notice("This agent is paused or gone; it cannot answer again.", 422)
    retry_reply(found)
    db.session.commit()
    return render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)


def _editable(chat: Chat, message_id: int) -> Message:
    """Your own last message: after it come only agents' replies to it (and notices, which are no turn)."""
    found = _message_in(chat, message_id)
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


@bp.get("/<int:chat_id>/agents/<int:agent_id>/memory")
@login_required
def agent_memory(chat_id: int, agent_id: int) -> ResponseReturnValue:
    """What an agent of this chat remembers, read-only: the memories its next prompt in this chat holds (those
    that match the chat's latest messages, then its budget's worth of core memories and the journal of the last
    7 days) and how many did not fit. Members see what the agent's admin lets them (all of it, the core
    memories, or nothing); admins see all, with a link to the ledger."""
    chat = readable_chat_or_404(chat_id)
    agent = _chat_agent_or_404(chat, agent_id)
    shown = agent.memory_visible_to(current_user)
    held = prompt_memory(targets.for_agent(agent), chat, agent, utcnow())[0].shown_as(shown)
    # The turns each memory came from, those this person may read.
    readable = sa.select(Chat.id).where(access.readable_chats(current_user))
    sources = search.source_turns(held.ids, readable)
    return render_template(
        "chats/agent_memory.html",
        chat=chat,
        agent=agent,
        held=held,
        shown=shown,
        forgettable=_forgettable(held.ids),
        sources=sources,
    )


def _forgettable(memory_ids: list[int]) -> set[int]:
    """Those of these memories the signed-in person may forget (one query; none without ids)."""
    if not memory_ids:
        return set()
    query = sa.select(AgentMemory.id).where(
        AgentMemory.id.in_(memory_ids), access.memories_forgettable_by(current_user)
    )
    return set(db.session.scalars(query))


@bp.post("/<int:chat_id>/agents/<int:agent_id>/memory/<int:memory_id>/forget")
@login_required
def forget_memory(chat_id: int, agent_id: int, memory_id: int) -> ResponseReturnValue:
    """Forget a memory the agent's memory page shows here: a member one that came from a chat they are one of the
    people of, an admin any (access.memories_forgettable_by). A soft delete audited as them, which an admin can
    undo; the agent is not told. Any other memory is not found, and nothing changes."""
    chat = readable_chat_or_404(chat_id)
    agent = _chat_agent_or_404(chat, agent_id)
    memory = db.session.scalar(
        sa.select(AgentMemory).where(
            AgentMemory.id == memory_id,
            AgentMemory.agent_id == agent.id,
            access.memories_heard_in(chat),
            access.memories_forgettable_by(current_user),
        )
    )
    if memory is None or not agent.shows_memory_to(current_user, memory.memory_type):
        abort(404)
    if memory.constitutional:
        return notice(
            f"This memory is constitutional: {agent.name} keeps it, and it cannot be forgotten.", 422
        )
    if memory.is_active:
        before = memory.snapshot()
        memory.soft_delete()
        record_change(memory, "memory_delete", before, via=FORGOTTEN_VIA, user_id=current_user.id)
        db.session.commit()
    if not request.headers.get("HX-Request"):
        flash(f"Forgotten: {agent.name} no longer brings “{memory.content[:80]}” to its replies.")
        return redirect(url_for("chats.agent_memory", chat_id=chat.id, agent_id=agent.id), code=303)
    return render_template("chats/_forgotten.html", agent=agent, memory=memory)


def _chat_agent_or_404(chat: Chat, agent_id: int) -> Agent:
    """The agent of this chat with this id; any other is a 404."""
    agent = next((a for a in chat.agents if a.id == agent_id), None)
    if agent is None:
        abort(404)
    return agent


@bp.post("/<int:chat_id>/rename")
@login_required
def rename(chat_id: int) -> ResponseReturnValue:
    """Rename the chat in place."""
    chat = readable_chat_or_404(chat_id)
    if not access.may_govern(chat, current_user):
        return notice("Only the chat's people rename it.", 403)
    title = request.form.get("title", "").strip()
    if len(title) > 200:
        return notice("A title has at most 200 characters.", 422)
    chat.title = title
    db.session.commit()
    return render_template("chats/_title.html", chat=chat, renamed=True, governs=True)


@bp.post("/<int:chat_id>/agents")
@login_required
def add_agent(chat_id: int) -> ResponseReturnValue:
    """Add an agent of the account to the chat; it becomes a group chat and a notice says who joined."""
    chat = _open_chat(chat_id)
    agent = owned_or_404(Agent, request.form.get("agent_id", type=int) or 0)
    if agent in chat.agents:
        return notice(f"{agent.name} is already in this chat.", 422)
    chat.add_agent(agent)
    chat.manual_responses = True
    chat.add_message(role="system", content=f"{agent.name} joined the conversation.", status="done")
    db.session.commit()
    return redirect(url_for("chats.show", chat_id=chat.id), code=303)


@bp.route("/<int:chat_id>/memory-doc", methods=["GET", "POST"])
@login_required
def memory_doc(chat_id: int) -> ResponseReturnValue:
    """The chat's conversation summary (spec 004): read it; admins edit it, and each edit is audited."""
    chat = readable_chat_or_404(chat_id)
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
    """Discard the chat for everyone (it can be restored), saying who did: its people only (others hide it)."""
    chat = _governed_chat(chat_id)
    chat.discarded_at, chat.discarded_by_id = utcnow(), current_user.id
    db.session.commit()
    return redirect(url_for("chats.index"), code=303)


@bp.post("/<int:chat_id>/restore")
@login_required
def restore(chat_id: int) -> ResponseReturnValue:
    """Bring a discarded chat back (its people only)."""
    chat = _governed_chat(chat_id)
    chat.discarded_at, chat.discarded_by_id = None, None
    db.session.commit()
    return redirect(url_for("chats.show", chat_id=chat.id), code=303)


def _governed_chat(chat_id: int) -> Chat:
    """A chat the person may read and govern (access.may_govern), else 404 or 403."""
    chat = readable_chat_or_404(chat_id)
    if not access.may_govern(chat, current_user):
        abort(403)
    return chat


@bp.post("/<int:chat_id>/hide")
@login_required
def hide(chat_id: int) -> ResponseReturnValue:
    """Take a chat out of one's own list (anyone who may read it); nobody else's list changes."""
    chat = readable_chat_or_404(chat_id)
    if db.session.get(ChatHidden, (chat.id, current_user.id)) is None:
        db.session.add(ChatHidden(chat_id=chat.id, user_id=current_user.id))
        db.session.commit()
    flash(f"“{chat.display_title}” is hidden from your list (and only yours): find it under Discarded.")
    return redirect(url_for("chats.index"), code=303)


@bp.post("/<int:chat_id>/unhide")
@login_required
def unhide(chat_id: int) -> ResponseReturnValue:
    """Put a chat one hid back in one's list."""
    chat = readable_chat_or_404(chat_id)
    db.session.execute(
        sa.delete(ChatHidden).where(ChatHidden.chat_id == chat.id, ChatHidden.user_id == current_user.id)
    )
    db.session.commit()
    return redirect(url_for("chats.show", chat_id=chat.id), code=303)


def _people_panel(chat: Chat) -> dict:
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


def _governed(chat: Chat, *, join: bool = True) -> list[int]:
    """The ids of the chat's people, if the signed-in person is one of them (else a 403): they may share the chat,
    make it private and add or take out people. A chat from before chats had people has none, and everyone of
    the account reads it: only an admin governs it (a member could otherwise hide it from all the others), and
    becomes its person (with `join`), so making it private never hides it from them too."""
    people = access.people_of(chat)
    if not people and join:
        if not current_user.is_admin:
            abort(403)
        db.session.add(ChatPerson(chat_id=chat.id, user_id=current_user.id, added_by_id=current_user.id))
        return [current_user.id]
    if current_user.id not in people:
        abort(403)
    return people


def _back_to(
    chat: Chat, said: str, announced: str | None = None, *, to: str | None = None
) -> ResponseReturnValue:
    """Commit a change to the chat's people or visibility, `announced` in the chat; back to the chat (or `to`)."""
    posted = chat.add_message(role="system", content=announced, status="done") if announced else None
    db.session.commit()
    if posted:
        announce_new(chat, [posted])
    flash(said)
    return redirect(to or url_for("chats.show", chat_id=chat.id), code=303)


def _not_widened(chat: Chat, people: list[int] | None, who_may_not: str) -> str | None:
    """Why the chat may not be opened to `people` (None: everyone of the account), in words; None if it may. A
    reply being written may still draw on whatever is heard now, so the chat waits for it."""
    if db.session.scalar(
        sa.select(sa.exists().where(Message.chat_id == chat.id, Message.status.in_(WAITING)))
    ):
        return "a reply is still being written here; try again once it is done."
    if closed := access.sources_closed_to(chat, people):
        return f"its replies drew on {access.named_for(closed, current_user)}, which {who_may_not}."
    return None


@bp.post("/<int:chat_id>/visibility")
@login_required
def visibility(chat_id: int) -> ResponseReturnValue:
    """Make the chat private (its people only) or shared (everyone of the account): any person of it may, but
    sharing is refused while its replies drew on a chat not everyone may read (access.sources_closed_to)."""
    chat = readable_chat_or_404(chat_id)
    form = VisibilityForm()
    if not form.validate():
        abort(400)
    wanted = form.visibility.data
    if wanted == chat.visibility:  # the switch's current side: nothing to change
        return redirect(url_for("chats.show", chat_id=chat.id), code=303)
    _governed(chat)
    everyone = current_user.account.name  # the words of the switch: "Only its people" | "Everyone in Acme"
    if wanted == "shared" and (why := _not_widened(chat, None, f"not everyone in {everyone} may read")):
        db.session.rollback()
        return _back_to(
            chat, f"Not opened to everyone in {everyone}: {why} Start a new chat to talk with everyone."
        )
    chat.visibility = wanted
    if chat.is_private:
        said = "Only this chat's people can read it now."
        announced = f"{current_user.display_name} made this chat readable by its people only."
    else:
        said = f"Everyone in {everyone} can read this chat now."
        announced = f"{current_user.display_name} opened this chat to everyone in {everyone}."
    return _back_to(chat, said, announced)


@bp.post("/<int:chat_id>/people")
@login_required
def add_person(chat_id: int) -> ResponseReturnValue:
    """Add one of the account's people (not a removed one) to the chat: they can read it, even while private;
    refused while its replies drew on a chat they may not read (access.sources_closed_to)."""
    chat = readable_chat_or_404(chat_id)
    people = _governed(chat)
    form = PersonForm()
    form.user_id.choices = [(p.id, p.name) for p in current_user.account.people_names() if p.id not in people]
    if not form.validate():
        db.session.rollback()
        return _back_to(chat, "That person cannot be added to this chat.")
    name = dict(form.user_id.choices)[form.user_id.data]
    if why := _not_widened(chat, [*people, form.user_id.data], f"{name} may not read"):
        db.session.rollback()
        return _back_to(chat, f"{name} was not added: {why} Start a new chat with them instead.")
    db.session.add(ChatPerson(chat_id=chat.id, user_id=form.user_id.data, added_by_id=current_user.id))
    announced = f"{current_user.display_name} added {name} to the conversation."
    return _back_to(chat, f"{name} can read this chat now.", announced)


@bp.post("/<int:chat_id>/people/<int:user_id>/remove")
@login_required
def remove_person(chat_id: int, user_id: int) -> ResponseReturnValue:
    """Take a person out of the chat (or leave it): not whoever started it, and one person always stays."""
    chat = readable_chat_or_404(chat_id)
    people = _governed(chat, join=False)
    if user_id not in people:
        abort(404)
    if user_id == chat.started_by_id:
        return _back_to(chat, "Whoever started a chat stays in it.")
    if len(people) == 1:
        return _back_to(chat, "A chat keeps at least one person.")
    person = db.session.get(User, user_id)
    db.session.delete(db.session.get(ChatPerson, (chat.id, user_id)))
    if user_id != current_user.id:
        announced = f"{current_user.display_name} took {person.display_name} out of the conversation."
        return _back_to(chat, f"{person.display_name} is no longer one of this chat's people.", announced)
    gone = url_for("chats.index") if chat.is_private else None  # they may no longer read it
    return _back_to(chat, f"You left “{chat.display_title}”.", f"{person.display_name} left.", to=gone)


def _open_chat(chat_id: int) -> Chat:
    chat = readable_chat_or_404(chat_id)
    if chat.is_discarded:
        abort(409, "This chat is discarded; restore it to continue.")
    return chat


@bp.get("/<int:chat_id>/stream")
@login_required
def stream(chat_id: int) -> ResponseReturnValue:
    """Server-Sent Events for this chat: reply text as it streams, then each finished message. The stream ends
    once its person may no longer read the chat (made private, or they were taken out of it); the browser's
    reconnection is then a 404."""
    chat = readable_chat_or_404(chat_id)
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
        checked_at = time.monotonic()
        for event in events.listen(chat.id, seconds, keepalive):
            # Asked before each message is sent, and every few seconds of streamed text or of silence (at each
            # keepalive), so a stream ends within seconds once its person may no longer read the chat.
            if (
                event is not None and event["kind"] != "delta"
            ) or time.monotonic() - checked_at > STREAM_RECHECK_SECONDS:
                if not _still_readable(chat):
                    return
                checked_at = time.monotonic()
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


def _still_readable(chat: Chat) -> bool:
    readable = bool(access.readable_among(current_user, [chat.id]))
    db.session.close()  # hold no database connection while waiting for the next event
    return readable


def _render_final(chat: Chat, message_id: int) -> str:
    _forget_which_chats_readable()  # which chats the viewer may read may have changed since the last event
    found = db.session.get(Message, message_id)  # a fresh transaction: sees what the worker just committed
    if found is None or found.chat_id != chat.id:
        db.session.close()
        return ""
    html = render_template("chats/_message.html", chat=chat, message=found, stuck_after=STUCK_AFTER)
    db.session.close()  # hold no database connection while waiting for the next event
    return html
