"""One search over an agent's past: its memories and the messages of its conversations.

`recall`, the prompt's memory selection and the ledger's search box all come here. A search ranks by every kind
of evidence in webapp.search.signals, one module each: words (BM25 in each database: webapp.search.sqlite,
webapp.search.postgres) and, when vectors are there, meaning (the query's embedding against the stored ones);
and fuses their lists (fused). A message found comes back with the turns around it (excerpts), as answers are
often split across turns. Which is best was measured on LoCoMo with bench/locomo.py; each kind's weight lives in
its module, and how they are fused here and in webapp.search.fusion.

The scope of a search is a set of SQL conditions on the searched table, applied inside both the word and the
vector query, so a top-k is never filled with rows that are then dropped.

A memory found counts toward the turns it came from (sources): given the memories found, `messages` ranks by a
third list, each memory's fused score given to its source turns (drawn_from), so the turns behind a memory that
matches are found with it, and recall shows the memory with the excerpt that holds them. Measured with LoCoMo's
observations as memories (bench.locomo --memories observations), recall's R@10 on the dev conversations: 0.839
with memory hits beside message hits, 0.852 with the third list at weight 1 (0.7: 0.849, 1.5: 0.847), and no
better with the memories' word and meaning lists given to their turns apart, or with 100 candidates (issue 33).
Among what the lists found, the rows of a date the query names, and the messages of the people it names, come
first (webapp.search.mentions): 0.880, and 0.881 with meaning weighted 1.5 (webapp.search.signals.meaning).
"""

import contextvars
import functools
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import sqlalchemy as sa
from flask import Flask, current_app
from sqlalchemy.orm import joinedload, lazyload

from webapp.extensions import db
from webapp.llm import ledger
from webapp.models import Agent, AgentMemory, Chat, MemorySource, Message, User
from webapp.search import embedder, mentions, signals
from webapp.search.databases import backend as backend
from webapp.search.fusion import SOURCES_COUNTED as SOURCES_COUNTED
from webapp.search.fusion import Signal, fused
from webapp.search.fusion import drawn_from as drawn_from
from webapp.search.signals.meaning import nearest as nearest
from webapp.search.terms import Match, terms

log = logging.getLogger(__name__)

CANDIDATES = 50  # from each kind of evidence (webapp.search.signals), before fusion
TURNS_BEFORE, TURNS_AFTER = 2, 1  # shown around a message found
READABLE_ROLES = ("user", "assistant")
READABLE = (Message.status == "done", Message.role.in_(READABLE_ROLES))  # the turns a search may show


@dataclass
class Excerpt:
    """A stretch of one conversation around the messages a search found, oldest turn first."""

    chat: Chat
    turns: list[Message]
    found: list[int] = field(default_factory=list)  # ids of the turns that matched, best first


def ranked(model: type, text: str, match: Match, *scope: sa.ColumnElement[bool]) -> sa.Subquery | None:
    """(id, rank) of the rows of `model` (AgentMemory or Message) whose words match text within the scope,
    lower rank first; None when text has no words."""
    words = terms(text)
    if not words:
        return None
    return backend().lexical(model, words, match, scope).subquery(f"{model.__tablename__}_hits")


def query_vector(
    text: str, *, agent_id: int | None = None, chat_id: int | None = None, vectors: bool | None = None
) -> Future[np.ndarray | None]:
    """The embedding of a query, computed on a thread of its own while the search by words runs (it took 6 to 9
    ms of a recall's 50; bench.recall); its result is None when there are no vectors to search (search is then
    by words). `vectors`: whether there are, when the caller asked already (the backend's vectors_held)."""
    if vectors is None:
        vectors = vector_dimensions() is not None
    if not text.strip() or not vectors:
        nothing: Future[np.ndarray | None] = Future()
        nothing.set_result(None)
        return nothing
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    using = embedder.for_search(agent_id, chat_id)  # read here: the thread may have no connection to spare
    vector: Future[np.ndarray | None] = Future()
    # In a copy of the caller's context (the job run its cost is recorded under), in an app context of its own.
    _embedding_threads.submit(
        contextvars.copy_context().run, _embed, vector, app, text, agent_id, chat_id, using
    )
    return vector


_embedding_threads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="query-embedding")


def _embed(
    vector: Future[np.ndarray | None],
    app: Flask,
    text: str,
    agent_id: int | None,
    chat_id: int | None,
    using: embedder.Embedder,
) -> None:
    """The query's vector, handed over before its cost-ledger row is written, which is set aside for the
    ledger's thread: a reply's search neither waits for it nor has it written beside its statements."""
    with app.app_context(), ledger.rows_at_end():
        try:
            vector.set_result(embedder.embed([text], agent_id=agent_id, chat_id=chat_id, using=using)[0])
        except embedder.EmbeddingError as error:
            log.warning("searching by words only: %s", error)
            vector.set_result(None)
        except BaseException as error:
            vector.set_exception(error)
            raise


def vector_dimensions() -> int | None:
    """The dimensions of the stored vectors; None when there are none (no extension, nothing embedded)."""
    try:
        return backend().vector_dimensions()
    except sa.exc.DBAPIError:
        db.session.rollback()
        return None


def memories(
    agent_id: int,
    text: str,
    k: int,
    *scope: sa.ColumnElement[bool],
    vector: Future[np.ndarray | None] | None = None,
) -> list[AgentMemory]:
    """The agent's memories within the scope (conditions on AgentMemory) that best match text, best first; by
    meaning too when given the query's vector (query_vector)."""
    return loaded_memories(agent_id, memory_ids(agent_id, text, k, *scope, vector=vector), *scope)


def loaded_memories(agent_id: int, ids: list[int], *scope: sa.ColumnElement[bool]) -> list[AgentMemory]:
    """The memories of these ids that are the agent's within the scope, in the order given."""
    # The scope again, on the caller's connection: the search by meaning read only what is committed.
    loaded = sa.select(AgentMemory).where(AgentMemory.id.in_(ids), AgentMemory.agent_id == agent_id, *scope)
    found = {m.id: m for m in db.session.scalars(loaded)}
    return [found[i] for i in ids if i in found]


def memory_ids(
    agent_id: int,
    text: str,
    k: int,
    *scope: sa.ColumnElement[bool],
    vector: Future[np.ndarray | None] | None = None,
    meanwhile: bool = True,
) -> list[int]:
    """The ids of `memories`, read from the indexes alone (the prompt reads the memories it lists itself), by
    words and meaning only: a conversation's "today" asks for nothing made today, so what a query names
    (webapp.search.mentions) counts in an asked search (memory_hits) alone. With meanwhile=False the search by
    meaning runs after the words, on the caller's connection, not beside them (see signals.meaning): for a
    search by words shorter than the query's embedding, which it waits for anyway."""
    return [i for i, _ in _memory_fused(agent_id, text, scope, vector, meanwhile)[:k]]


def memory_hits(
    agent_id: int,
    text: str,
    k: int,
    *scope: sa.ColumnElement[bool],
    vector: Future[np.ndarray | None] | None = None,
) -> list[tuple[int, float]]:
    """The memories an asked search finds (recall's), with their fused scores (for drawn_from): `memory_ids`,
    and those made on a date the query names first (webapp.search.mentions)."""
    return mentions.favoured(AgentMemory, text, _memory_fused(agent_id, text, scope, vector, True))[:k]


def _memory_fused(
    agent_id: int,
    text: str,
    scope: tuple[sa.ColumnElement[bool], ...],
    vector: Future[np.ndarray | None] | None,
    meanwhile: bool,
) -> list[tuple[int, float]]:
    scope = (AgentMemory.agent_id == agent_id, *scope)
    query = signals.Query(AgentMemory, text, scope, [agent_id], vector, CANDIDATES, meanwhile)
    return fused(_signals(query))


def messages(
    chats: sa.Select,
    text: str,
    k: int,
    *,
    vector: Future[np.ndarray | None] | None = None,
    memories: Signal | None = None,
) -> list[Excerpt]:
    """Excerpts of the chats (a query of chat ids) around the readable messages that best match text, ranked also
    by `memories` when given (the turns of the memories found: drawn_from). The chats are read once, and both
    searches are given their ids. Only the readable turns have vectors (webapp.search.indexing), so the vector
    search is scoped by the chats alone."""
    chat_ids = db.session.scalars(chats).all()
    if not chat_ids:
        return []
    scope = (backend().among(Message.chat_id, chat_ids), *READABLE)
    query = signals.Query(Message, text, scope, chat_ids, vector, CANDIDATES)
    found = fused(_signals(query) + ([memories] if memories else []))
    return excerpts([i for i, _ in mentions.favoured(Message, text, found)[:k]])


def _signals(query: signals.Query) -> list[Signal]:
    """The ranked list of every kind of evidence (webapp.search.signals), in its order: each search started before
    any is read, so the meaning's may run on a thread of its own meanwhile."""
    started = [(evidence, evidence.search(query)) for evidence in signals.REGISTRY]
    return [Signal(hits(), evidence.weight, evidence.alone_at_least) for evidence, hits in started]


def sources(memory_ids: list[int], chats: sa.Select) -> dict[int, list[int]]:
    """The ids of the readable turns each memory came from, oldest first, in the chats `chats` (a query of chat
    ids the access rule admits) only: a memory heard everywhere may come from a private chat."""
    if not memory_ids:
        return {}
    rows = db.session.execute(
        sa.select(MemorySource.memory_id, MemorySource.message_id)
        .join(Message, Message.id == MemorySource.message_id)
        .where(MemorySource.memory_id.in_(memory_ids), Message.chat_id.in_(chats), *READABLE)
        .order_by(MemorySource.message_id)
    )
    found: dict[int, list[int]] = {}
    for memory_id, message_id in rows:
        found.setdefault(memory_id, []).append(message_id)
    return found


def source_turns(memory_ids: list[int], chats: sa.Select) -> dict[int, list[Message]]:
    """`sources` as the turns themselves, with their chat and author (for the pages that link to them)."""
    found = sources(memory_ids, chats)
    wanted = {i for ids in found.values() for i in ids}
    if not wanted:
        return {}
    turns = {
        m.id: m
        for m in db.session.scalars(
            sa.select(Message)
            .where(Message.id.in_(wanted))
            .options(joinedload(Message.chat), joinedload(Message.user), joinedload(Message.agent))
        )
    }
    return {memory_id: [turns[i] for i in ids] for memory_id, ids in found.items()}


def excerpts(found_ids: list[int]) -> list[Excerpt]:
    """Each found message with the readable turns before and after it in its chat; found messages
    whose stretches touch are one excerpt. In the order of each excerpt's best message."""
    result: list[Excerpt] = []
    for message_id, stretch in stretches(found_ids).items():
        message = next(t for t in stretch if t.id == message_id)
        joined = next((e for e in result if e.chat.id == message.chat_id and _touch(e, stretch)), None)
        if joined is None:
            result.append(Excerpt(chat=message.chat, turns=stretch, found=[message_id]))
        else:
            joined.turns = sorted({t.id: t for t in joined.turns + stretch}.values(), key=lambda t: t.id)
            joined.found.append(message_id)
    return result


def stretches(found_ids: list[int]) -> dict[int, list[Message]]:
    """Each found message that is readable, in the order given, with the readable turns before and after it in
    its chat, oldest first (one query)."""
    if not found_ids:
        return {}
    shown = db.session.scalars(_turns_query(), {"found_ids": found_ids})
    turns = {m.id: m for m in shown}
    by_chat: dict[int, list[Message]] = {}  # each chat's loaded turns, in order
    for turn in sorted(turns.values(), key=lambda t: t.id):
        by_chat.setdefault(turn.chat_id, []).append(turn)
    # Not in turns: no longer readable (edited, failed); its vector goes with the next embed run.
    return {i: _stretch(by_chat[turns[i].chat_id], turns[i]) for i in dict.fromkeys(found_ids) if i in turns}


@functools.cache
def _turns_query() -> sa.Select:
    """The found messages (bound as found_ids) that are readable and the readable turns around each in its
    chat, in one statement (their ids a CTE, read once), with what an excerpt shows of each: its text, date,
    author's name and chat (id, title); anything else read later is loaded then. With whole rows, the excerpts
    of 10 messages found for 'roses' took 9.7 ms of Python, with these 5.5 (bench.recall's data)."""
    around = _turns_around_query().cte("around").prefix_with("MATERIALIZED")
    return (
        sa.select(Message)
        .where(Message.id.in_(sa.union_all(*(sa.select(column) for column in around.c))))
        .options(
            sa.orm.load_only(
                Message.id, Message.chat_id, Message.role, Message.content, Message.user_id, Message.agent_id,
                Message.created_at,
            ),
            joinedload(Message.chat).load_only(Chat.id, Chat.title),
            joinedload(Message.user).load_only(User.id, User.name, User.email),
            joinedload(Message.agent).load_only(Agent.id, Agent.name),
            lazyload(Message.sources),
        )
    )  # fmt: skip


@functools.cache
def _turns_around_query() -> sa.Select:
    """One row per found message (bound as found_ids), holding its id and its neighbours' (each a subquery of
    one row, by OFFSET). Its plan costs the same for any number of found messages (a union of a subquery per
    neighbour took PostgreSQL 6 ms to plan for 10); built once, as building it took longer than running it."""
    found_ids = sa.bindparam("found_ids", expanding=True)
    found = (
        sa.select(Message.id, Message.chat_id).where(Message.id.in_(found_ids), *READABLE).subquery("found")
    )
    turn = sa.orm.aliased(Message, name="turn")
    same_chat = sa.select(turn.id).where(
        turn.chat_id == found.c.chat_id, turn.status == "done", turn.role.in_(READABLE_ROLES)
    )
    before = same_chat.where(turn.id < found.c.id).order_by(turn.id.desc())
    after = same_chat.where(turn.id > found.c.id).order_by(turn.id)
    neighbours = [before.limit(1).offset(n).scalar_subquery() for n in range(TURNS_BEFORE)]
    neighbours += [after.limit(1).offset(n).scalar_subquery() for n in range(TURNS_AFTER)]
    return sa.select(found.c.id, *neighbours)


def _stretch(same_chat: list[Message], message: Message) -> list[Message]:
    """The message and its neighbours among the loaded turns of its chat (in order), in order."""
    at = same_chat.index(message)
    return same_chat[max(0, at - TURNS_BEFORE) : at + TURNS_AFTER + 1]


def _touch(excerpt: Excerpt, stretch: list[Message]) -> bool:
    ids = {t.id for t in excerpt.turns}
    return any(t.id in ids for t in stretch)
