"""Keeping the vector index in step with memories and messages.

What is embedded (chosen on LoCoMo with bench/locomo.py): a memory's content; a message with its author's name
between the turns before and after it, as answers are often split across turns (R@10 0.80 against 0.75 for the
turn alone and 0.79 with the turn before only). So a new message is embedded, and the one before it again. A
row that can no longer be found (a deleted memory, a message that is not a finished user or agent turn) has its
vectors removed.

Each row is embedded by its account's embedder (webapp.search.embedder.writing): while a new choice's vectors are
written (fill), by both the one its search ranks by and the new one, so neither misses what is written meanwhile.
"""

import logging
from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import joinedload

from webapp.extensions import db
from webapp.models import Account, Agent, AgentMemory, Chat, Message
from webapp.models.search import EMBEDDED_KINDS, EmbeddingQueue
from webapp.search import READABLE as SHOWN
from webapp.search import backend, embedder
from webapp.search.embedder import Embedder, EmbeddingError

log = logging.getLogger(__name__)

READABLE = (*SHOWN, Message.content != "")  # the turns a search may show, with text to embed

BATCH = 64  # rows embedded and committed together by fill
TURN_CHARS = 600  # of a message in its embedded text (the local model reads 256 tokens at most)
NEIGHBOUR_CHARS = 240  # of each turn next to it


def memory_text(memory: AgentMemory) -> str:
    return memory.content


def message_text(message: Message, before: Message | None, after: Message | None) -> str:
    """The message between its neighbours, each "Author: text"; the neighbours are cut shorter, so the message
    itself stays within what the embedder reads."""
    turns = [(before, NEIGHBOUR_CHARS), (message, TURN_CHARS), (after, NEIGHBOUR_CHARS)]
    return "\n".join(f"{m.author_name}: {m.content[:chars]}" for m, chars in turns if m)


def index_memories(ids: list[int], using: Embedder | None = None) -> int:
    """Write (or remove) the vectors of these memories, by `using` or their accounts' embedders (writing);
    returns how many were written. Embeds first and writes after, so no write lock waits on the embedder; each
    agent's memories are one call in its cost ledger per embedder."""
    memories = list(db.session.scalars(sa.select(AgentMemory).where(AgentMemory.id.in_(ids))))
    active = [m for m in memories if m.is_active]
    embedded = []
    for agent_id, group in _by_owner(active, "agent_id"):
        rows, texts = [(m.id, m.agent_id) for m in group], [memory_text(m) for m in group]
        embedded += _embedded(rows, texts, _embedders(using, agent_id=agent_id), agent_id=agent_id)
    backend().delete_vectors("memory", [i for i in ids if i not in {m.id for m in active}])
    _write("memory", embedded, keep_others=using is not None)
    return len(active)


def index_messages(ids: list[int], using: Embedder | None = None) -> int:
    """Write (or remove) the vectors of these messages, and write again that of the turn before each (its
    text holds the turn after it); returns how many were written. Embeds first, one call per chat and embedder."""
    gone = set(ids)
    wanted = _readable(ids)
    wanted += _readable([before for before in _next_to(wanted, before=True).values() if before not in ids])
    gone -= {m.id for m in wanted}
    embedded = []
    if wanted:
        before, after = _next_to(wanted, before=True), _next_to(wanted, before=False)
        loaded = {m.id: m for m in _readable([*before.values(), *after.values()])}
        for chat_id, group in _by_owner(wanted, "chat_id"):
            texts = [
                message_text(m, loaded.get(before.get(m.id)), loaded.get(after.get(m.id))) for m in group
            ]
            rows = [(m.id, m.chat_id) for m in group]
            embedded += _embedded(rows, texts, _embedders(using, chat_id=chat_id), chat_id=chat_id)
    backend().delete_vectors("message", list(gone))
    _write("message", embedded, keep_others=using is not None)
    return len(wanted)


def _embedders(using: Embedder | None, **owner: int) -> list[Embedder]:
    if using is not None:
        return [using]
    account = embedder.account_of(owner.get("agent_id"), owner.get("chat_id"))
    return embedder.writing(account) if account is not None else [embedder.environment()]


def _embedded(rows: list[tuple[int, int]], texts: list[str], embedders: list[Embedder], **owner: int) -> list:
    """(rows, vectors, the model names the rows keep) per embedder. The first (the one search ranks by) must
    answer; a new choice's failing leaves these rows without its vectors, for fill to write (its job says why)."""
    found = [embedder.embed(texts, using=embedders[0], **owner)]
    for extra in embedders[1:]:
        try:
            found.append(embedder.embed(texts, using=extra, **owner))
        except EmbeddingError as error:
            log.warning("no vectors of %s for now (its re-embedding writes them): %s", extra.name, error)
    kept = {vectors.model for vectors in found}
    return [(rows, vectors, kept) for vectors in found]


def _write(kind: str, embedded: list, *, keep_others: bool) -> None:
    """Store the vectors; unless told to keep them, remove the rows' vectors of any other model (out of date)."""
    for rows, vectors, kept in embedded:
        _store(kind, rows, vectors)
        if not keep_others:
            _delete_other_models(kind, [i for i, _owner in rows], kept)


def _delete_other_models(kind: str, ids: list[int], kept: set[str]) -> None:
    table, key = _vector_table(kind)
    db.session.execute(sa.delete(table).where(key.in_(ids), table.c.model.not_in(sorted(kept))))


def forget_messages_of(chat_id: int) -> None:
    """Remove the vectors of a chat's messages and their queued embeddings (a chat deleted for good); the
    words' index follows the messages themselves (SQLite's triggers, PostgreSQL's generated column)."""
    messages = sa.select(Message.id).where(Message.chat_id == chat_id)
    db.session.execute(
        sa.delete(EmbeddingQueue).where(EmbeddingQueue.kind == "message", EmbeddingQueue.row_id.in_(messages))
    )
    if _vector_tables_exist():
        table, _key = _vector_table("message")
        db.session.execute(sa.delete(table).where(table.c.chat_id == chat_id))


def _vector_table(kind: str) -> tuple[sa.TableClause, sa.ColumnClause]:
    """The table holding this kind's vectors (columns: row id, owner, model), and its column of row ids."""
    name, key, owner = backend().VECTOR_TABLES[kind][:3]
    table = sa.table(name, sa.column(key), sa.column(owner), sa.column("model"))
    return table, table.c[key]


def _vector_tables_exist() -> bool:
    return sa.inspect(db.session.connection()).has_table(_vector_table("memory")[0].name)


# --- an account's vectors of its chosen model: what `flask memories reindex` and a new choice's job write ---


def searched_rows(kind: str) -> tuple[type, tuple[sa.ColumnElement[bool], ...]]:
    """The model whose rows of this kind carry vectors, and which of its rows do."""
    if kind == "memory":
        return AgentMemory, (AgentMemory.is_active,)
    return Message, READABLE


def _of_account(kind: str, account_id: int | None) -> tuple[sa.ColumnElement[bool], ...]:
    if account_id is None:
        return ()
    if kind == "memory":
        return (AgentMemory.agent_id.in_(sa.select(Agent.id).where(Agent.account_id == account_id)),)
    return (Message.chat_id.in_(sa.select(Chat.id).where(Chat.account_id == account_id)),)


def missing(kind: str, account_id: int, model_name: str, everything: bool = False) -> sa.Select:
    """The ids of the account's rows of this kind to embed: lacking a vector of the model (or all of them)."""
    model, conditions = searched_rows(kind)
    query = sa.select(model.id).where(*conditions, *_of_account(kind, account_id))
    if everything or not _vector_tables_exist():
        return query
    vectors, key = _vector_table(kind)
    return query.where(~sa.exists().where(key == model.id, vectors.c.model == model_name))


def _counted(query: sa.Select) -> int:
    return db.session.scalar(sa.select(sa.func.count()).select_from(query.subquery()))


def progress(account: Account) -> tuple[int, int]:
    """(how many, of how many) of the account's memories and messages have a vector of its chosen embedder."""
    name = embedder.chosen(account).name
    total = sum(_counted(missing(kind, account.id, name, everything=True)) for kind in EMBEDDED_KINDS)
    lacking = sum(_counted(missing(kind, account.id, name)) for kind in EMBEDDED_KINDS)
    return total - lacking, total


def fill(
    account: Account, everything: bool = False, step: Callable[[str, int, int], None] | None = None
) -> dict:
    """Write the vectors of the account's chosen embedder that its rows lack (every row again with everything),
    a committed batch at a time; once none lacks one, its search ranks by them (switch). `step(kind, done,
    total)` after each batch. Stopped, it goes on where it stopped."""
    using = embedder.chosen(account)
    written = {kind: _fill(kind, account.id, using, everything, step) for kind in EMBEDDED_KINDS}
    if embedder.chosen(account).name != using.name:  # an admin chose another meanwhile (commits reload it)
        return {"model": using.name, **written, "switched": False, "superseded": True}
    complete = not any(_counted(missing(kind, account.id, using.name)) for kind in EMBEDDED_KINDS)
    switched = complete and account.embedding_searched is not None
    if complete:  # the vectors of another model are of no use now (a change of the EMBEDDING_* settings too)
        switch(account)
        db.session.commit()
    return {"model": using.name, **written, "switched": switched}


def _fill(kind: str, account_id: int, using: Embedder, everything: bool, step) -> int:
    model = searched_rows(kind)[0]
    total = _counted(missing(kind, account_id, using.name, everything))
    index = index_memories if kind == "memory" else index_messages
    after, done = 0, 0
    while done < total:
        query = missing(kind, account_id, using.name, everything).where(model.id > after)
        ids = db.session.scalars(query.order_by(model.id).limit(BATCH)).all()
        if not ids:
            break
        index(list(ids), using=using)
        db.session.commit()
        after, done = ids[-1], done + len(ids)
        if step is not None:
            step(kind, done, total)
    return done


def switch(account: Account) -> None:
    """Search ranks by the chosen embedder's vectors from now on; the account's vectors of other models go."""
    account.embedding_searched = None
    if not _vector_tables_exist():
        return
    kept = embedder.chosen(account).name
    for kind in EMBEDDED_KINDS:
        table, _key = _vector_table(kind)
        owner = table.c[backend().VECTOR_TABLES[kind][2]]
        owners = (
            sa.select(Agent.id).where(Agent.account_id == account.id)
            if kind == "memory"
            else sa.select(Chat.id).where(Chat.account_id == account.id)
        )
        db.session.execute(sa.delete(table).where(owner.in_(owners), table.c.model != kept))


def _by_owner(rows: list, owner: str) -> list[tuple[int, list]]:
    """The rows grouped by their owner's id (an agent's memories, a chat's messages), in order of first row."""
    groups: dict[int, list] = {}
    for row in rows:
        groups.setdefault(getattr(row, owner), []).append(row)
    return list(groups.items())


def _readable(ids: list[int]) -> list[Message]:
    """The finished user and agent turns among these messages, with their authors."""
    if not ids:
        return []
    return list(
        db.session.scalars(
            sa.select(Message)
            .where(Message.id.in_(ids), *READABLE)
            .options(joinedload(Message.user), joinedload(Message.agent))
            .order_by(Message.id)
        )
    )


def _next_to(messages: list[Message], *, before: bool) -> dict[int, int]:
    """Each message's id -> the id of the readable turn just before (or after) it in its chat, in one query."""
    current = (
        sa.select(Message.id, Message.chat_id).where(Message.id.in_([m.id for m in messages])).subquery()
    )
    neighbour = sa.select(sa.func.max(Message.id) if before else sa.func.min(Message.id)).where(
        Message.chat_id == current.c.chat_id,
        Message.id < current.c.id if before else Message.id > current.c.id,
        *READABLE,
    )
    pairs = db.session.execute(sa.select(current.c.id, neighbour.scalar_subquery())).all()
    return {i: n for i, n in pairs if n is not None}


def _store(kind: str, rows: list[tuple[int, int]], vectors: embedder.Vectors) -> None:
    search = backend()
    search.ensure_vector_tables(vectors.shape[1])
    search.store_vectors(
        kind, [(i, owner, vectors.model, v) for (i, owner), v in zip(rows, vectors, strict=True)]
    )
