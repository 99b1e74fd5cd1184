"""The OpenAI-compatible API (/v1): any OpenAI client lists an account's agents as models and talks to them.

Each request acts as the person of its API key (webapp.web.api_auth), with no cookie and no CSRF token. An exchange
is a chat of that person, posted and answered by what the pages use (Chat.start, post_message, the reply job),
so an agent answers the same whoever asks: its system prompt, its memory, its tools run inside Cairn, its model.
"""

from flask import Blueprint, Flask, g, request

from webapp.api import errors
from webapp.extensions import csrf
from webapp.web.api_auth import person_for_bearer

bp = Blueprint("api", __name__, url_prefix="/v1")
errors.register(bp)


@bp.before_request
def _the_keys_person() -> None:
    """Every /v1 request acts as the person of a live key, or is refused (401) before any work."""
    header = request.headers.get("Authorization")
    if not header:
        raise errors.unauthorized(
            "No API key: send `Authorization: Bearer <key>`. Make a key on your account page in Cairn (/account)."
        )
    person = person_for_bearer(header)
    if person is None:
        raise errors.unauthorized(
            "This API key is not valid: it is wrong, revoked, or its person was removed."
        )
    g.api_person = person


def init_app(app: Flask) -> None:
    csrf.exempt(bp)
    errors.init_app(app)
    app.register_blueprint(bp)


from webapp.api import views  # noqa: E402, F401  (its routes are bp's)
