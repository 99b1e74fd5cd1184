"""GET /v1/models, GET /v1/models/<id> and POST /v1/chat/completions: the agents of the key's person's account
as models, and an exchange with one of them as a chat of that person."""

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC

import sqlalchemy as sa
from flask import Blueprint, Response, current_app, g, request, stream_with_context
from flask.typing import ResponseReturnValue

from webapp import events
from webapp.actions.ask import post_message
from webapp.api import errors
from webapp.api.answers import Completion, follow, streamed, waited
from webapp.api.conversations import Asked, agent_for, chat_for, parse
from webapp.api.errors import ApiError
from webapp.extensions import db
from webapp.limits import replies_limit
from webapp.models import Agent, Chat, User
from webapp.models.api_keys import person_for_bearer

# How long a request waits for its reply (as long as the chat page's stream lasts); then a 503 or 504.
REPLY_SECONDS = 300

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
    g.api_person = person  # limits.user_key counts the replies limit per person, pages and keys together


def _model(agent: Agent) -> dict:
    created = int(agent.created_at.replace(tzinfo=UTC).timestamp())
    return {"id": agent.slug, "object": "model", "created": created, "owned_by": "cairn"}


@bp.get("/models")
def models() -> ResponseReturnValue:
    """The agents of the person's account, each as a model whose id is the agent's slug."""
    agents = db.session.scalars(
        sa.select(Agent).where(Agent.account_id == g.api_person.account_id).order_by(Agent.slug)
    )
    return {"object": "list", "data": [_model(agent) for agent in agents]}


@bp.get("/models/<model_id>")
def model(model_id: str) -> ResponseReturnValue:
    """One agent as a model, or 404 (model_not_found)."""
    return _model(agent_for(g.api_person, model_id))


@bp.post("/chat/completions")
@replies_limit
def chat_completions() -> ResponseReturnValue:
    """The agent answers the request's last message in a chat of the person, streamed or whole."""
    person = g.api_person
    asked = parse(person, request.get_json(silent=True))
    if asked.agent.paused:
        raise _paused(asked.agent.name)
    seconds = current_app.config.get("API_REPLY_SECONDS", REPLY_SECONDS)
    name, completion = asked.agent.name, Completion(model=asked.agent.slug)
    with ExitStack() as held:  # a stream slot and the chat's events, while the reply is waited for
        held.callback(_stream_slot(person.id, seconds))
        chat = chat_for(person, asked)
        inbox = held.enter_context(events.subscribed(chat.id))  # before the reply is asked for: none missed
        reader = (person.id, person.account_id)
        answer = follow(inbox, _ask(chat, person, asked), seconds, reader, chat.id)
        if not asked.stream:
            return waited(completion, name, answer, seconds)
        kept = held.pop_all()  # let go by the stream
    chunks = _closing(streamed(completion, name, answer, seconds, asked.include_usage), kept)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    response = Response(stream_with_context(chunks), mimetype="text/event-stream", headers=headers)
    response.call_on_close(kept.close)  # also when the stream never started
    return response


def _paused(name: str) -> ApiError:
    return ApiError(409, f"{name} is paused: an admin of your account can unpause it.", code="model_paused")


def _stream_slot(person_id: int, seconds: float) -> Callable[[], None]:
    """One of the person's STREAM_MAX_PER_USER slots (chat pages' streams and API requests waiting for replies
    share them), or a 429."""
    release = events.take_stream_slot(person_id, current_app.config["STREAM_MAX_PER_USER"], seconds)
    if release is None:
        raise ApiError(
            429, "Too many of your replies are open at once; wait for one to finish.", kind="requests",
            code="rate_limit_exceeded", headers={"Retry-After": "5"},
        )  # fmt: skip
    return release


def _ask(chat: Chat, person: User, asked: Asked) -> int:
    """Post the person's message and ask the agent, as the chat page does; the id of the reply to wait for."""
    _, replies = post_message(chat, person, asked.content, [asked.agent])
    if not replies:
        raise _paused(asked.agent.name)  # paused meanwhile
    reply_id = replies[0].id
    db.session.close()  # hold no database connection while waiting
    return reply_id


def _closing(chunks: Iterator[str], held: ExitStack) -> Iterator[str]:
    """The chunks; then the stream slot and the chat's events are let go, when the stream ends or its client
    leaves (the next write fails and the generator is closed)."""
    with held:
        yield from chunks
