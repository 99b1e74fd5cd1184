"""What a chat completion request asks, and which chat of the key's person it belongs to.

A client sends its whole conversation every time; Cairn keeps its own. Only the request's last message, the
person's, is added to a chat; the history before it only chooses the chat and never rewrites what Cairn stored.
The chat is: the one the client names (X-Cairn-Conversation, metadata.conversation_id or `user`), else the newest
API chat of the person with this agent whose stored messages the history repeats exactly, else a new one. With
X-Cairn-Remember: no, it is a temporary chat (nothing of it is remembered), and only a temporary chat continues.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from flask import current_app, request

from webapp.api.errors import ApiError
from webapp.extensions import db
from webapp.models import Agent, Chat, ChatAgent, Message, User, access

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
CONVERSATION_HEADER = "X-Cairn-Conversation"
REMEMBER_HEADER = "X-Cairn-Remember"  # "no": a temporary chat, of which nothing is remembered (issue 42)
REMEMBER_VALUES = {"yes": True, "true": True, "1": True, "no": False, "false": False, "0": False}
MAX_CLIENT_ID_CHARS = 200  # chats.client_conversation_id
CANDIDATES = 20  # the newest chats of the right length whose messages are compared with a history
UNSTORABLE = "\x00"
# Parameters Cairn cannot honour, when a request gives them a value that asks for something (`asks`), and why.
# A client relying on one would get an answer other than the one it asked for, so it is told (400) instead.
# The rest (temperature, top_p, penalties, seed, ...) are accepted and not used: the agent answers with its own
# model and settings, as it does in Cairn (README, "What a request may ask").
_WHOLE = "the reply is one message of the chat, written whole by the agent's model with its own settings"
_OWN_TOOLS = "the agent's tools are its own and run inside Cairn; it cannot call a client's"
UNHONOURED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v != 1, "one answer per request: " + _WHOLE),
    "response_format": (
        lambda v: not (isinstance(v, dict) and v.get("type") == "text"),
        "the agent answers in its own words, in no format or schema a client sets",
    ),
    "logprobs": (bool, "the reply keeps no token probabilities"),
    "top_logprobs": (lambda v: True, "the reply keeps no token probabilities"),
    "max_tokens": (lambda v: True, "no shorter answer can be asked for: " + _WHOLE),
    "max_completion_tokens": (lambda v: True, "no shorter answer can be asked for: " + _WHOLE),
    "stop": (bool, "it cannot stop at a client's sequences: " + _WHOLE),
    "logit_bias": (bool, _WHOLE),
    "tools": (bool, _OWN_TOOLS),
    "functions": (bool, _OWN_TOOLS),
    "tool_choice": (lambda v: v not in ("none", "auto"), _OWN_TOOLS),
    "function_call": (lambda v: v not in ("none", "auto"), _OWN_TOOLS),
    "modalities": (lambda v: v != ["text"], "Cairn's agents answer in text only"),
    "audio": (lambda v: True, "Cairn's agents answer in text only"),
    "web_search_options": (lambda v: True, _OWN_TOOLS),
}


@dataclass
class Asked:
    """A chat completion request, checked: the agent, the person's new message, and what chooses the chat."""

    agent: Agent
    content: str
    history: list[tuple[str, str]]  # (role, text) of the user and assistant messages with text before it
    client_id: str | None
    stream: bool
    include_usage: bool
    remembers: bool = True  # False: the exchange is in a temporary chat (X-Cairn-Remember: no)


def parse(person: User, body: Any) -> Asked:
    """The request, or an ApiError saying what is wrong with it (400), or that its model is unknown (404)."""
    if not isinstance(body, dict):
        raise ApiError(
            400, "The body must be a JSON object (Content-Type: application/json).", code="invalid_json"
        )
    _refuse_unhonoured(body)
    turns = _turns(body.get("messages"))
    role, content = turns[-1]
    if role != "user":
        raise ApiError(
            400, "The last message must be the user's: it is what the agent answers.", param="messages"
        )
    content = _checked_content(content)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "`stream` must be true or false.", param="stream")
    options = body.get("stream_options") or {}
    return Asked(
        agent=agent_for(person, body.get("model")),
        content=content,
        history=[(r, t) for r, t in turns[:-1] if r in ("user", "assistant") and t.strip()],
        client_id=_client_id(body),
        stream=stream,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        remembers=_remembers(),
    )


def _remembers() -> bool:
    """Whether the exchange is remembered: X-Cairn-Remember: no asks for a temporary chat."""
    value = (request.headers.get(REMEMBER_HEADER) or "").strip().lower()
    if not value:
        return True
    if value not in REMEMBER_VALUES:
        raise ApiError(400, f"{REMEMBER_HEADER} must be yes or no.", param=REMEMBER_HEADER)
    return REMEMBER_VALUES[value]


def _refuse_unhonoured(body: dict) -> None:
    """A 400 naming every parameter of the request that asks for what Cairn cannot honour (UNHONOURED)."""
    named = [
        (name, why)
        for name, (asks, why) in UNHONOURED.items()
        if body.get(name) is not None and asks(body[name])
    ]
    if named:
        reasons = "; ".join(f"`{name}`: {why}" for name, why in named)
        raise ApiError(
            400,
            f"Cairn cannot honour {', '.join(f'`{n}`' for n, _ in named)} ({reasons}). Leave "
            f"{'it' if len(named) == 1 else 'them'} out to talk to the agent.",
            param=named[0][0],
            code="unsupported_parameter",
        )


def agent_for(person: User, model: Any) -> Agent:
    """The agent of the person's account whose slug is `model`, else a 404 (model_not_found)."""
    if not isinstance(model, str) or not model.strip():
        raise ApiError(
            400, "`model` is required: an agent's id, as GET /v1/models lists them.", param="model"
        )
    agent = Agent.by_slug(person.account_id, model)
    if agent is None:
        raise ApiError(
            404,
            f"The model `{model}` does not exist or you do not have access to it: GET /v1/models lists your agents.",
            param="model",
            code="model_not_found",
        )
    return agent


def _turns(messages: Any) -> list[tuple[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "`messages` must be a non-empty array of messages.", param="messages")
    return [_turn(i, m) for i, m in enumerate(messages)]


def _turn(index: int, message: Any) -> tuple[str, str]:
    param = f"messages[{index}]"
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise ApiError(400, f"{param} must be an object with a role ({', '.join(ROLES)}).", param=param)
    return message["role"], _text(message.get("content"), f"{param}.content")


def _text(content: Any, param: str) -> str:
    """A message's text: a string, or the text parts of an array of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ApiError(
                    400, f"{param}: Cairn's agents take text only (parts of type text).", param=param
                )
            parts.append(part["text"])
        return "\n".join(parts)
    raise ApiError(400, f"{param} must be a string or an array of text parts.", param=param)


def _checked_content(content: str) -> str:
    text = content.strip()
    limit = current_app.config["MESSAGE_MAX_CHARS"]
    if not text:
        raise ApiError(
            400, "The last message is empty: write something for the agent to answer.", param="messages"
        )
    if len(text) > limit:
        raise ApiError(
            400,
            f"The last message has {len(text):,} characters; the limit is {limit:,}.",
            param="messages",
            code="string_above_max_length",
        )
    if UNSTORABLE in text:
        raise ApiError(
            400, "The last message contains a NUL character, which Cairn cannot store.", param="messages"
        )
    return text


def _client_id(body: dict) -> str | None:
    """The client's own id of the conversation, if it gives one: a header, metadata.conversation_id, or `user`."""
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
    for value, param in (
        (request.headers.get(CONVERSATION_HEADER), CONVERSATION_HEADER),
        (metadata.get("conversation_id"), "metadata.conversation_id"),
        (body.get("user"), "user"),
    ):
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if not isinstance(value, str) or len(value.strip()) > MAX_CLIENT_ID_CHARS or UNSTORABLE in value:
            raise ApiError(
                400, f"{param} must be a string of at most {MAX_CLIENT_ID_CHARS} characters.", param=param
            )
        return value.strip()
    return None


def chat_for(person: User, asked: Asked) -> Chat:
    """The chat this exchange belongs to (module docstring); a new one is added (not committed), private to the
    person and marked as coming through the API."""
    if asked.client_id:
        return _named(person, asked)
    return _continued(person, asked) or _new(person, asked)


def _new(person: User, asked: Asked) -> Chat:
    chat = Chat.start(
        person,
        [asked.agent],
        source="api",
        client_conversation_id=asked.client_id,
        remembers=asked.remembers,
    )
    db.session.flush()
    return chat


def _theirs(person: User, agent: Agent) -> sa.Select:
    """The person's API chats with this agent that they may still read, newest first."""
    return (
        sa.select(Chat)
        .join(ChatAgent, ChatAgent.chat_id == Chat.id)
        .where(
            ChatAgent.agent_id == agent.id,
            Chat.started_by_id == person.id,
            Chat.source == "api",
            Chat.discarded_at.is_(None),
            access.readable_chats(person),
        )
        .order_by(Chat.last_message_at.desc(), Chat.id.desc())
    )


def _named(person: User, asked: Asked) -> Chat:
    """The chat the client's id names, made on its first use. Requests racing to make it are settled by the
    unique constraint on (person, agent, id): each tries in a savepoint, and a loser reads the winner's chat."""
    for _ in range(3):  # a winner whose chat is out of reach by the time it is read is raced again
        found = db.session.scalar(_theirs(person, asked.agent).where(_names(person, asked)).limit(1))
        if found is not None:
            return _same_remembering(found, asked)
        try:
            with db.session.begin_nested():
                _release(person, asked)
                return _new(person, asked)
        except sa.exc.IntegrityError:
            continue  # another request made it first
    raise ApiError(409, "Another request is making this conversation's chat; ask again.", code="conflict")


def _same_remembering(chat: Chat, asked: Asked) -> Chat:
    """The named chat, if the request asks for it as it is (remembered, or temporary); else a 409 saying so: a
    conversation is never turned from one into the other."""
    if chat.remembers == asked.remembers:
        return chat
    kind, header = (
        ("remembered", f"without {REMEMBER_HEADER}: no")
        if chat.remembers
        else ("temporary", f"with {REMEMBER_HEADER}: no")
    )
    raise ApiError(
        409,
        f"The conversation `{asked.client_id}` is {kind}: continue it {header}, or name another conversation.",
        code="conflict",
    )


def _names(person: User, asked: Asked) -> sa.ColumnElement[bool]:
    return sa.and_(
        Chat.started_by_id == person.id,
        Chat.client_agent_id == asked.agent.id,
        Chat.client_conversation_id == asked.client_id,
    )


def _release(person: User, asked: Asked) -> None:
    """A chat the id names that the person can no longer continue (discarded, or out of their reach) lets go
    of it: the conversation goes on in a new chat."""
    usable = _theirs(person, asked.agent).with_only_columns(Chat.id).order_by(None)
    db.session.execute(
        sa.update(Chat)
        .where(_names(person, asked), Chat.id.not_in(usable))
        .values(client_conversation_id=None, client_agent_id=None)
    )


def _stored_turns():
    return sa.and_(Message.role.in_(("user", "assistant")), Message.status == "done", Message.content != "")


def _continued(person: User, asked: Asked) -> Chat | None:
    """The newest of the person's API chats with the agent whose finished messages are the history, in order."""
    if not asked.history:
        return None
    length = sa.select(sa.func.count(Message.id)).where(Message.chat_id == Chat.id, _stored_turns())
    same_kind = Chat.remembers.is_(asked.remembers)
    chats = db.session.scalars(
        _theirs(person, asked.agent)
        .where(same_kind, length.scalar_subquery() == len(asked.history))
        .limit(CANDIDATES)
    ).all()
    if not chats:
        return None
    stored: dict[int, list[tuple[str, str]]] = {chat.id: [] for chat in chats}
    rows = db.session.execute(
        sa.select(Message.chat_id, Message.role, Message.content)
        .where(Message.chat_id.in_(stored), _stored_turns())
        .order_by(Message.chat_id, Message.id)
    )
    for chat_id, role, content in rows:
        stored[chat_id].append((role, content.strip()))
    wanted = [(role, text.strip()) for role, text in asked.history]
    return next((chat for chat in chats if stored[chat.id] == wanted), None)
