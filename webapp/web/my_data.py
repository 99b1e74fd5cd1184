"""My data (issue 42): a person downloads their chats and every memory drawn from them, as one JSON document or
as Markdown, from the page "What agents remember of you".

Their chats are those they are one of the people of and may read (a shared chat they only read is not theirs),
discarded ones too, each with its finished turns in order; their memories are webapp.actions.forgetting.listed,
as that page lists them. Both downloads are streamed: chats, turns and memories are read PAGE at a time, so a
download of any size holds one page in memory.
"""

import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime

import sqlalchemy as sa
from flask import Blueprint, Response, stream_with_context
from flask.typing import ResponseReturnValue
from flask_login import current_user, login_required

from webapp import limits
from webapp.actions import forgetting
from webapp.agent_files.naming import iso
from webapp.extensions import db, limiter
from webapp.models import Agent, AgentMemory, Chat, ChatAgent, ChatPerson, MemorySource, Message, User
from webapp.models.access import chats_of_person, readable_chats
from webapp.timeutil import utcnow

bp = Blueprint("my_data", __name__, url_prefix="/account")
PAGE = 500  # rows read at a time: turns, memories, chats
TURNS = ("user", "assistant", "system")  # a tool's result is the agent's working, not a turn of the chat
FORMAT = "cairn-my-data"

# Each download reads everything a person has said: a few an hour, counted per person.
downloads_limit = limiter.shared_limit(
    "10 per hour",
    scope="my-data",
    key_func=limits.user_key,
    error_message="You have downloaded your data too often.",
)


@bp.get("/data.json")
@login_required
@downloads_limit
def as_json() -> ResponseReturnValue:
    """Download the person's chats and memories as one JSON document."""
    return _download(_json, "json", "application/json")


@bp.get("/data.md")
@login_required
@downloads_limit
def as_markdown() -> ResponseReturnValue:
    """Download the person's chats and memories as a Markdown document."""
    return _download(_markdown, "md", "text/markdown; charset=utf-8")


def _download(write: Callable[[User, datetime], Iterator[str]], extension: str, mimetype: str) -> Response:
    user, now = current_user._get_current_object(), utcnow()
    name = f"cairn-data-{now.date().isoformat()}.{extension}"
    return Response(
        stream_with_context(write(user, now)),
        mimetype=mimetype,
        headers={"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store"},
    )


# The JSON document, written a piece at a time: each object opened by json.dumps (so every text is escaped),
# its last brace taken off while its list is written.


def _json(user: User, now: datetime) -> Iterator[str]:
    head = {"format": FORMAT, "version": 1, "downloaded_at": iso(now), **_person(user)}
    yield _open(head, "chats")
    for n, chat in enumerate(_chats(user)):
        yield ("," if n else "") + _open(chat, "messages")
        for m, page in enumerate(_turn_pages(chat["id"])):
            yield ("," if m else "") + ",".join(_dumps(turn) for turn in page)
        yield "]}"
    yield '], "memories": ['
    for n, page in enumerate(_memory_pages(user)):
        yield ("," if n else "") + ",".join(_dumps(memory) for memory in page)
    yield "]}\n"


def _open(entry: dict, key: str) -> str:
    """The object with `key` opened as a list, to be closed with "]}"."""
    return _dumps(entry)[:-1] + f', "{key}": ['


def _dumps(entry: dict) -> str:
    return json.dumps(entry, ensure_ascii=False)


# The Markdown document: headings and names on one line each, what was said as it was said.


def _markdown(user: User, now: datetime) -> Iterator[str]:
    person = _person(user)
    yield "# Your Cairn data\n\n"
    yield (
        f"{_line(person['person']['name'])} ({_line(person['person']['email'])}) of {_line(person['account'])}, "
        f"downloaded {_when(now)}: every chat you are one of the people of, with its messages, then every memory "
        "agents drew from your chats.\n"
    )
    chats = False
    for chat in _chats(user):
        chats = True
        yield "\n" + _chat_heading(chat)
        for page in _turn_pages(chat["id"]):
            yield "".join(
                f"\n**{_line(t['author'])}** ({_when(t['created_at'])}): {t['content']}\n" for t in page
            )
    if not chats:
        yield "\nYou are one of the people of no chat.\n"
    yield "\n## What agents remember of you\n"
    agent = None
    for page in _memory_pages(user):
        for memory in page:
            if memory["agent"] != agent:
                agent = memory["agent"]
                yield f"\n### {_line(agent)}\n"
            yield f"\n{memory['content']}\n\n{_memory_line(memory)}\n"
    if agent is None:
        yield "\nNo agent remembers anything drawn from your chats.\n"


def _chat_heading(chat: dict) -> str:
    about = [f"Started {_when(chat['created_at'])}"]
    if chat["discarded_at"]:
        about.append(f"discarded {_when(chat['discarded_at'])}")
    about.append("people: " + (", ".join(_line(name) for name in chat["people"]) or "none"))
    about.append("agents: " + (", ".join(_line(name) for name in chat["agents"]) or "none"))
    return f"## {_line(chat['title'])}\n\n{'; '.join(about)}.\n"


def _memory_line(memory: dict) -> str:
    kind = memory["type"] + (", constitutional" if memory["constitutional"] else "")
    drawn = memory["source_message_ids"]
    sources = f"; drawn from messages {', '.join(map(str, drawn))}" if drawn else ""
    return f"*{kind}, saved {_when(memory['created_at'])}; heard by {_line(memory['audience'])}{sources}.*"


def _line(text: str) -> str:
    """Text that stays on its line: a title or a name cannot start a heading or a paragraph of its own."""
    return " ".join(text.split())


def _when(moment: str | datetime) -> str:
    moment = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return moment.strftime("%Y-%m-%d %H:%M UTC")


# What both documents hold, read a page at a time.


def _person(user: User) -> dict:
    return {"person": {"name": user.display_name, "email": user.email}, "account": user.account.name}


def _chats(user: User) -> Iterator[dict]:
    """The person's chats, oldest first, with their people and agents by name (PAGE chats to a query)."""
    after = 0
    while page := db.session.scalars(
        sa.select(Chat).where(chats_of_person(user), Chat.id > after).order_by(Chat.id).limit(PAGE)
    ).all():
        ids = [chat.id for chat in page]
        people, agents = _people_of(ids), _agents_of(ids)
        for chat in page:
            yield {
                "id": chat.id,
                "title": chat.display_title,
                "visibility": chat.visibility,
                "created_at": iso(chat.created_at),
                "discarded_at": iso(chat.discarded_at),
                "people": people[chat.id],
                "agents": agents[chat.id],
            }
        after = ids[-1]


def _people_of(chat_ids: list[int]) -> dict[int, list[str]]:
    """Each chat's people by name, in the order they joined (someone removed from the account is no one)."""
    found = defaultdict(list)
    for chat_id, user in db.session.execute(
        sa.select(ChatPerson.chat_id, User)
        .join(User, User.id == ChatPerson.user_id)
        .where(ChatPerson.chat_id.in_(chat_ids), User.removed_at.is_(None))
        .order_by(ChatPerson.created_at, User.id)
    ):
        found[chat_id].append(user.display_name)
    return found


def _agents_of(chat_ids: list[int]) -> dict[int, list[str]]:
    found = defaultdict(list)
    for chat_id, name in db.session.execute(
        sa.select(ChatAgent.chat_id, Agent.name)
        .join(Agent, Agent.id == ChatAgent.agent_id)
        .where(ChatAgent.chat_id.in_(chat_ids))
        .order_by(ChatAgent.id)
    ):
        found[chat_id].append(name)
    return found


def _turn_pages(chat_id: int) -> Iterator[list[dict]]:
    """The chat's finished turns, oldest first, PAGE to a page: a keyset on the id (each page one index scan),
    read as columns (a page of ORM rows weighs several times as much), each author named once per chat."""
    after, authors = 0, _Authors()
    while page := db.session.execute(
        sa.select(
            Message.id, Message.role, Message.created_at, Message.content, Message.user_id, Message.agent_id
        )
        .where(
            Message.chat_id == chat_id, Message.status == "done", Message.role.in_(TURNS), Message.id > after
        )
        .order_by(Message.id)
        .limit(PAGE)
    ).all():
        authors.learn(page)
        yield [
            {
                "id": turn.id,
                "author": authors.name(turn),
                "role": turn.role,
                "created_at": iso(turn.created_at),
                "content": turn.content,
            }
            for turn in page
        ]
        after = page[-1].id


class _Authors:
    """The names of the people and agents who wrote a chat's turns (as Message.author_name names them)."""

    def __init__(self) -> None:
        self.people: dict[int, str] = {}
        self.agents: dict[int, str] = {}

    def learn(self, turns: list[sa.Row]) -> None:
        """Name the authors of these turns not named yet (a query for each kind, none when all are known)."""
        people = {t.user_id for t in turns if t.user_id and t.user_id not in self.people}
        agents = {t.agent_id for t in turns if t.agent_id and t.agent_id not in self.agents}
        if people:
            rows = db.session.scalars(sa.select(User).where(User.id.in_(people)))
            self.people.update((user.id, user.display_name) for user in rows)
        if agents:
            rows = db.session.execute(sa.select(Agent.id, Agent.name).where(Agent.id.in_(agents)))
            self.agents.update((agent_id, name) for agent_id, name in rows)

    def name(self, turn: sa.Row) -> str:
        if turn.agent_id in self.agents:
            return self.agents[turn.agent_id]
        if turn.user_id in self.people:
            return self.people[turn.user_id]
        return "System" if turn.role == "system" else "User"


def _memory_pages(user: User) -> Iterator[list[dict]]:
    """forgetting.listed (by agent, newest first), PAGE to a page: the ids in that order first, then each page's
    rows, the turns they were drawn from that the person may read and the chats whose people hear them."""
    ids = db.session.scalars(forgetting.listed(user).with_only_columns(AgentMemory.id)).all()
    everyone = f"everyone in {user.account.name}"
    for start in range(0, len(ids), PAGE):
        wanted = ids[start : start + PAGE]
        rows = {
            memory.id: (memory, name)
            for memory, name in db.session.execute(
                sa.select(AgentMemory, Agent.name)
                .join(Agent, Agent.id == AgentMemory.agent_id)
                .where(AgentMemory.id.in_(wanted), forgetting.memories_of(user))  # still theirs
            )
        }
        sources, titles = _sources(user, wanted), _titles({m.chat_id for m, _ in rows.values() if m.chat_id})
        yield [
            {
                "id": memory.id,
                "agent": name,
                "type": memory.memory_type,
                "constitutional": memory.constitutional,
                "content": memory.content,
                "created_at": iso(memory.created_at),
                "audience": f"only the people of “{titles[memory.chat_id]}”"
                if memory.audience == "chat" and memory.chat_id in titles
                else everyone,
                "source_message_ids": sources[memory.id],
            }
            for memory, name in (rows[i] for i in wanted if i in rows)
        ]


def _sources(user: User, memory_ids: list[int]) -> dict[int, list[int]]:
    """Each memory's source turns (message ids, oldest first) in chats the person may read."""
    found = defaultdict(list)
    for memory_id, message_id in db.session.execute(
        sa.select(MemorySource.memory_id, MemorySource.message_id)
        .join(Message, Message.id == MemorySource.message_id)
        .where(
            MemorySource.memory_id.in_(memory_ids),
            Message.chat_id.in_(sa.select(Chat.id).where(readable_chats(user))),
        )
        .order_by(MemorySource.message_id)
    ):
        found[memory_id].append(message_id)
    return found


def _titles(chat_ids: set[int]) -> dict[int, str]:
    """The titles of the chats whose people alone hear the memories (each one the person hears, so may read)."""
    if not chat_ids:
        return {}
    return {
        chat.id: chat.display_title
        for chat in db.session.scalars(sa.select(Chat).where(Chat.id.in_(chat_ids)))
    }
