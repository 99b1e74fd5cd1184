"""A chat's memory pages: what an agent of the chat remembers here (and forgetting one of those memories), and
the chat's conversation summary."""

import sqlalchemy as sa
from flask import abort, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required

from webapp import search
from webapp.extensions import db
from webapp.llm import targets
from webapp.models import AgentMemory, AuditLog, Chat, access
from webapp.models.audit import FORGOTTEN_VIA, record_change
from webapp.prompting.build import prompt_memory
from webapp.timeutil import utcnow
from webapp.web.auth import readable_chat_or_404
from webapp.web.chats.common import bp, chat_agent_or_404
from webapp.web.guards import notice

MEMORY_DOC_MAX_CHARS = 100_000


@bp.get("/<int:chat_id>/agents/<int:agent_id>/memory")
@login_required
def agent_memory(chat_id: int, agent_id: int) -> ResponseReturnValue:
    """What an agent of this chat remembers, read-only: the memories its next prompt in this chat holds (those
    that match the chat's latest messages, then its budget's worth of core memories and the journal of the last
    7 days) and how many did not fit. Members see what the agent's admin lets them (all of it, the core
    memories, or nothing); admins see all, with a link to the ledger."""
    chat = readable_chat_or_404(chat_id)
    agent = chat_agent_or_404(chat, agent_id)
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
    agent = chat_agent_or_404(chat, agent_id)
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
