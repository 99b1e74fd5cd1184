"""Keeping the vector index in step with memories and messages.

What is embedded (chosen on LoCoMo with bench/locomo.py): a memory's content; a message with its author's name
between the turns before and after it, as answers are often split across turns (R@10 0.80 against 0.75 for the
turn alone and 0.79 with the turn before only). So a new message is embedded, and the one before it again. A
row that can no longer be found (a deleted memory, a message that is not a finished user or agent turn) has its
vector removed.
"""

import sqlalchemy as sa
from sqlalchemy.orm import joinedload

from webapp.extensions import db
from webapp.models import AgentMemory, Message
from webapp.search import READABLE as SHOWN
from webapp.search import backend, embedder

READABLE = (*SHOWN, Message.content != "")  # the turns a search may show, with text to embed

TURN_CHARS = 600  # of a message in its embedded text (the local model reads 256 tokens at most)
NEIGHBOUR_CHARS = 240  # of each turn next to it


def memory_text(memory: AgentMemory) -> str:
    return memory.content


def message_text(message: Message, before: Message | None, after: Message | None) -> str:
    """The message between its neighbours, each "Author: text"; the neighbours are cut shorter, so the message
    itself stays within what the embedder reads."""
    turns = [(before, NEIGHBOUR_CHARS), (message, TURN_CHARS), (after, NEIGHBOUR_CHARS)]
    return "\n".join(f"{m.author_name}: {m.content[:chars]}" for m, chars in turns if m)


def index_memories(ids: list[int]) -> int:
    """Write (or remove) the vectors of these memories; returns how many were written. Embeds first and writes
    after, so no write lock waits on the embedder; each agent's memories are one call in its cost ledger."""
    memories = list(db.session.scalars(sa.select(AgentMemory).where(AgentMemory.id.in_(ids))))
    active = [m for m in memories if m.is_active]
    embedded = [
        (
            [(m.id, m.agent_id) for m in group],
            embedder.embed([memory_text(m) for m in group], agent_id=agent_id),
        )
        for agent_id, group in _by_owner(active, "agent_id")
    ]
    backend().delete_vectors("memory", [i for i in ids if i not in {m.id for m in active}])
    for rows, vectors in embedded:
        _store("memory", rows, vectors)
    return len(active)


def index_messages(ids: list[int]) -> int:
    """Write (or remove) the vectors of these messages, and write again that of the turn before each (its
    text holds the turn after it); returns how many were written. Embeds first, one call per chat."""
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
            embedded.append(([(m.id, m.chat_id) for m in group], embedder.embed(texts, chat_id=chat_id)))
    backend().delete_vectors("message", list(gone))
    for rows, vectors in embedded:
        _store("message", rows, vectors)
    return len(wanted)


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


def _store(kind: str, rows: list[tuple[int, int]], vectors) -> None:
    search = backend()
    search.ensure_vector_tables(vectors.shape[1])
    model = embedder.model_name()
    search.store_vectors(kind, [(i, owner, model, v) for (i, owner), v in zip(rows, vectors, strict=True)])
