"""Errors on the pages, in words a person understands: a page in the app's layout (navigation, a way back) for a
plain request, a notice for an HTMX one (webapp.web.guards.notice). /v1 and /mcp answer in their own clients'
shapes: their blueprints' handlers are found before this app-wide one, and /v1 answers its own routing errors."""

from flask import Flask, Response, render_template, request
from flask_login import current_user
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from webapp.extensions import db
from webapp.web import guards

NO_CHAT = "This chat does not exist or is private to its people; ask whoever started it to add you."
# For each status: the page's heading and its sentence. A view's own description (abort(409, "...")) replaces
# the sentence; werkzeug's stock ones are written for developers.
SAID = {
    400: ("Something in the request was wrong", "Cairn could not read what was sent. Go back and try again."),
    403: ("Not yours to do", "This is for an admin of your account; ask one of them."),
    404: ("Not found", "There is nothing at this address, or it is not yours to see."),
    405: ("Not here", "There is nothing at this address to do that with."),
    409: ("Not now", "This cannot be done as things are now. Reload the page to see them."),
    500: (
        "Something went wrong",
        "Something failed on Cairn's side, not yours; what you did last may not have been saved. Try again in a "
        "moment; if it keeps happening, tell an admin of your account.",
    ),
}
IN_A_CHAT = {
    403: "Only this chat's people may do this; ask one of them.",
    404: NO_CHAT,
}
EXPIRED = "This page was open too long (or you signed in again elsewhere). Reload it, then try again."


def init_app(app: Flask) -> None:
    app.register_error_handler(HTTPException, _page_or_notice)


def _page_or_notice(error: HTTPException) -> Response | HTTPException:
    """The page (or the notice) for an error the pages raise or reach; any other status as werkzeug has it."""
    if error.code not in SAID:
        return error
    if error.code == 500:
        db.session.rollback()  # the layout reads the database (the review count); a failed transaction would not
    heading, sentence = _words(error)
    if request.headers.get("HX-Request") and not request.headers.get("HX-History-Restore-Request"):
        return guards.notice(sentence, error.code)
    html = render_template(
        "error.html", heading=heading, sentence=sentence, signed_in=current_user.is_authenticated
    )
    return Response(html, status=error.code)


def _words(error: HTTPException) -> tuple[str, str]:
    heading, sentence = SAID[error.code]
    if isinstance(error, CSRFError):
        return heading, EXPIRED
    if error.description != type(error).description:
        return heading, error.description
    if "chat_id" in (request.view_args or {}):
        return heading, IN_A_CHAT.get(error.code, sentence)
    return heading, sentence
