"""Requests refused before any work is done: too many of them (webapp.limits, answered here as a notice), bodies larger
than the app reads (413, before they are read), uploads from someone not signed in (before their parts are
parsed), and input that no database column can store (PostgreSQL rejects NUL in text)."""

from collections.abc import Callable

from flask import Flask, Response, abort, current_app, render_template, request
from flask_limiter import RateLimitExceeded
from flask_login import current_user
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.middleware.proxy_fix import ProxyFix

from webapp import limits

UNSTORABLE = "\x00"


def init_app(app: Flask) -> None:
    hops = app.config["TRUSTED_PROXY_HOPS"]
    if hops:  # behind a proxy, the client's address is in X-Forwarded-For, not the connection's
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops)
    limits.init_app(app)
    # Werkzeug refuses a body over MAX_CONTENT_LENGTH (by its Content-Length, or while reading a chunked one)
    # the first time anything reads it; a view marked accepts_upload has a limit of its own.
    app.config["MAX_CONTENT_LENGTH"] = app.config["REQUEST_MAX_BYTES"]
    # First of all hooks: CSRF's check (registered before this) parses the form, files included.
    app.before_request_funcs.setdefault(None, []).insert(0, _before_reading_the_body)
    app.before_request(_refuse_unstorable)
    app.register_error_handler(RateLimitExceeded, _too_many)
    app.register_error_handler(RequestEntityTooLarge, _too_large)


def notice(text: str, status: int) -> Response:
    """A message in the page's notice area, shown by htmx even with an error status (see base.html)."""
    response = Response(render_template("_notice.html", text=text), status=status)
    response.headers.update({"HX-Retarget": "#notice", "HX-Reswap": "outerHTML"})
    return response


def _too_many(error: RateLimitExceeded) -> Response:
    response = notice(limits.limit_message(error), 429)
    response.headers["Retry-After"] = str(limits.seconds_until_allowed())
    return response


def accepts_upload(setting: str) -> Callable:
    """Mark a view whose body may be as large as the setting (bytes) rather than REQUEST_MAX_BYTES."""

    def mark(view: Callable) -> Callable:
        view.max_body_setting = setting
        return view

    return mark


def _before_reading_the_body() -> Response | None:
    """The body's limit for this view; an upload (multipart) from someone not signed in is refused unread. Pages
    send them to sign in; /v1 and /mcp (API keys, never multipart) answer 401."""
    view = current_app.view_functions.get(request.endpoint or "")
    if setting := getattr(view, "max_body_setting", None):
        request.max_content_length = current_app.config[setting]
    if request.mimetype != "multipart/form-data" or current_user.is_authenticated:
        return None
    if request.blueprint in ("api", "mcp"):
        abort(401)
    return current_app.login_manager.unauthorized()


def _body_limit_text() -> str:
    """This request's body limit, in words."""
    limit = request.max_content_length or 0
    return f"{limit / 2**20:g} MB" if limit >= 2**20 else f"{limit // 1024} KB"


def _too_large(_error: RequestEntityTooLarge) -> Response:
    """413 in the app's style: a notice for HTMX, a page in the layout otherwise."""
    text = f"The request is larger than Cairn accepts here ({_body_limit_text()}); nothing was saved."
    if request.headers.get("HX-Request"):
        return notice(text, 413)
    return Response(render_template("too_large.html", text=text), status=413)


def _refuse_unstorable() -> Response | None:
    """A NUL byte anywhere in the query or form would fail the database write (PostgreSQL), so refuse it."""
    for source in (request.args, request.form):
        for key, value in source.items(multi=True):
            if UNSTORABLE in key or UNSTORABLE in value:
                return notice(
                    "Your input contains a NUL character, which Cairn cannot store. Remove it.", 422
                )
    return None
