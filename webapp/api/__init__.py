"""The OpenAI-compatible API (/v1): any OpenAI client lists an account's agents as models and talks to them.

Each request acts as the person of its API key (webapp.models.api_keys), with no cookie and no CSRF token. An exchange
is a chat of that person, posted and answered by what the pages use (Chat.start, webapp.actions.ask, the reply job),
so an agent answers the same whoever asks: its system prompt, its memory, its tools run inside Cairn, its model.

    views.py          the blueprint: /v1/models, /v1/chat/completions, and who the key acts as
    conversations.py  what a request asks, and which chat of the person it belongs to
    answers.py        the reply, waited for or relayed as server-sent chunks
    errors.py         every error in OpenAI's shape
"""

from flask import Flask

from webapp.api import errors, views
from webapp.extensions import csrf


def init_app(app: Flask) -> None:
    csrf.exempt(views.bp)
    errors.init_app(app)
    app.register_blueprint(views.bp)
