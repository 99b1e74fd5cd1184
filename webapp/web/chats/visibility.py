"""How a chat is seen: its title, who may read it (its people only, or everyone of the account), and whether it
is listed (discarded and restored for everyone, hidden and unhidden for oneself), or, a temporary chat, deleted
for good."""

import sqlalchemy as sa
from flask import abort, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required
from flask_wtf import FlaskForm
from wtforms import SelectField

from webapp.actions import narrowing, temporary_chats
from webapp.actions.memory import Refused
from webapp.extensions import db
from webapp.models import ChatHidden, access
from webapp.models.chats import CHAT_VISIBILITIES
from webapp.timeutil import utcnow
from webapp.web.auth import readable_chat_or_404
from webapp.web.chats.common import back_to, bp, governed, governed_chat, not_widened
from webapp.web.guards import notice


class VisibilityForm(FlaskForm):
    visibility = SelectField("Who can read this chat", choices=CHAT_VISIBILITIES)


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
    governed(chat)
    everyone = current_user.account.name  # the words of the switch: "Only its people" | "Everyone in Acme"
    if wanted == "shared" and (why := not_widened(chat, None, f"not everyone in {everyone} may read")):
        db.session.rollback()
        return back_to(
            chat, f"Not opened to everyone in {everyone}: {why} Start a new chat to talk with everyone."
        )
    chat.visibility = wanted
    if chat.is_private:
        narrowing.narrow_to(chat, current_user._get_current_object())
        said = "Only this chat's people can read it now."
        announced = f"{current_user.display_name} made this chat readable by its people only."
    else:
        said = f"Everyone in {everyone} can read this chat now."
        announced = f"{current_user.display_name} opened this chat to everyone in {everyone}."
    return back_to(chat, said, announced)


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


@bp.post("/<int:chat_id>/discard")
@login_required
def discard(chat_id: int) -> ResponseReturnValue:
    """Discard the chat for everyone (it can be restored), saying who did: its people only (others hide it)."""
    chat = governed_chat(chat_id)
    chat.discarded_at, chat.discarded_by_id = utcnow(), current_user.id
    db.session.commit()
    return redirect(url_for("chats.index"), code=303)


@bp.post("/<int:chat_id>/delete")
@login_required
def delete_for_good(chat_id: int) -> ResponseReturnValue:
    """Delete a temporary chat and its messages for good (its people only): nothing of it is left."""
    chat = governed_chat(chat_id)
    title = chat.display_title
    try:
        temporary_chats.delete_for_good(chat)
    except Refused as refused:
        flash(str(refused))
        return redirect(url_for("chats.show", chat_id=chat_id), code=303)
    db.session.commit()
    flash(f"“{title}” and all its messages are deleted for good.")
    return redirect(url_for("chats.index"), code=303)


@bp.post("/<int:chat_id>/restore")
@login_required
def restore(chat_id: int) -> ResponseReturnValue:
    """Bring a discarded chat back (its people only)."""
    chat = governed_chat(chat_id)
    chat.discarded_at, chat.discarded_by_id = None, None
    db.session.commit()
    return redirect(url_for("chats.show", chat_id=chat.id), code=303)


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
