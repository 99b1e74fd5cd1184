"""Vectors for every memory and message written, by a background job, never on the reply path.

Whatever writes a memory or a message through the ORM, the session records it in embedding_queue within the
same transaction (after_flush), and the commit queues one `embed_queued` run (before_commit): the queue rows
and the run's job_runs row commit with the write, so a Redis outage or a killed worker loses nothing (the
sweep queues a lost run again; an hourly finder queues a run for any row a failed run left). A reply job
queues that run once its own run is closed instead (run_queued_after), off the path of the person waiting. The
run embeds the rows a batch at a time (webapp.search.indexing), deleting each batch's queue rows as its vectors
commit.

Recorded: a memory added, or whose content or deletion changed; a message added or changed while "done" (a
streaming reply writes its text many times: only the finished one counts), or that stops being "done" or is
deleted (its vector goes). Cairn writes both only through the ORM (reflection's Core update changes a
memory's type, which its vector does not hold); a write made with a Core statement would call `record` itself.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from flask import current_app
from flask_sqlalchemy.session import Session as FlaskSession
from sqlalchemy.dialects import postgresql, sqlite

from webapp import search
from webapp.extensions import db
from webapp.jobs.queue import JOB_MARGIN_SECONDS, enqueue, job_target, recorded_job
from webapp.models import Account, AgentMemory, Message
from webapp.models.search import EmbeddingQueue
from webapp.runtime import priority
from webapp.search import embedder, indexing
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)

BATCH = 64  # queue rows embedded and committed together
EMBEDDING_CALLS = 360  # a run's time limit: this many requests, each allowed EMBEDDING_TIMEOUT_SECONDS
_RECORDED = "cairn_embedding_recorded"  # session.info: this transaction put rows in embedding_queue
_HELD = "cairn_embedding_run_held"  # session.info: commits leave the run to the end of run_queued_after()


def record(rows: list[tuple[str, int]], session: sa.orm.Session | None = None) -> None:
    """Put (kind, id) rows in embedding_queue in the session's transaction; its commit queues the job.

    A row already waiting gets a new created_at, which tells a run embedding it right now that it changed
    again meanwhile (that run then leaves it for the next)."""
    if not rows:
        return
    session = session or db.session()
    dialect = session.get_bind().dialect.name
    insert = (sqlite.insert if dialect == "sqlite" else postgresql.insert)(EmbeddingQueue.__table__)
    upsert = insert.on_conflict_do_update(
        index_elements=["kind", "row_id"], set_={"created_at": insert.excluded.created_at}
    )
    now = utcnow()
    # In one order, so two transactions touching the same rows take their locks alike (PostgreSQL).
    values = [{"kind": kind, "row_id": row_id, "created_at": now} for kind, row_id in sorted(set(rows))]
    session.connection().execute(upsert, values)
    session.info[_RECORDED] = True


@sa.event.listens_for(FlaskSession, "after_flush")
def _record_flushed(session: sa.orm.Session, _context: Any) -> None:
    record(_written(session), session)


def _written(session: sa.orm.Session) -> list[tuple[str, int]]:
    """The memories and messages of this flush whose vectors are now out of date."""
    rows = []
    for row in session.new:
        if isinstance(row, AgentMemory) or (isinstance(row, Message) and row.status == "done"):
            rows.append(_key(row))
    for row in session.dirty:
        if isinstance(row, AgentMemory) and _changed(row, "content", "deleted_at"):
            rows.append(_key(row))
        elif isinstance(row, Message) and _message_changed(row):
            rows.append(_key(row))
    rows += [_key(row) for row in session.deleted if isinstance(row, AgentMemory | Message)]
    return rows


def _key(row: AgentMemory | Message) -> tuple[str, int]:
    return ("memory" if isinstance(row, AgentMemory) else "message", row.id)


def _changed(row: Any, *names: str) -> bool:
    attributes = sa.inspect(row).attrs
    return any(attributes[name].history.has_changes() for name in names)


def _message_changed(message: Message) -> bool:
    """Finished and its text or status changed (an edit, a reply done), or no longer finished."""
    status = sa.inspect(message).attrs.status.history
    if message.status == "done":
        return _changed(message, "content", "status")
    return "done" in (status.deleted or ())


@sa.event.listens_for(FlaskSession, "before_commit")
def _queue_the_job(session: sa.orm.Session) -> None:
    if session.new or session.dirty or session.deleted:
        session.flush()  # records what this commit writes (commit would flush after this hook)
    if not session.info.pop(_RECORDED, False):
        return
    if session is not db.session():  # enqueue writes through the app's session; the next commit's run drains
        log.warning("embedding rows recorded by a session of its own; the next embedding run takes them")
        return
    if _HELD in session.info:
        session.info[_HELD] = True
        return
    enqueue(embed_queued)


@contextmanager
def run_queued_after() -> Iterator[None]:
    """Within it, a commit that records rows leaves their embedding run to be queued once it ends.

    A reply job queues it once its run is closed: the person sees the reply without waiting for that enqueue
    (three statements and a Redis push), and the rows, committed with the reply, are safe meanwhile (a worker
    killed before the end leaves them to the hourly finder)."""
    session = db.session()
    session.info[_HELD] = False
    try:
        yield
    finally:
        if session.info.pop(_HELD, False):
            _queue_held_run(session)


def _queue_held_run(session: sa.orm.Session) -> None:
    try:
        enqueue(embed_queued)
        session.commit()
    except Exception:  # the rows wait in embedding_queue; queue_waiting queues their run within the hour
        session.rollback()
        log.exception("could not queue the embedding run after a reply; the hourly finder will")


@sa.event.listens_for(FlaskSession, "after_rollback")
def _forget_recorded(session: sa.orm.Session) -> None:
    session.info.pop(_RECORDED, None)


def _time_limit(*_args: Any) -> int:
    return int(EMBEDDING_CALLS * current_app.config["EMBEDDING_TIMEOUT_SECONDS"]) + JOB_MARGIN_SECONDS


@recorded_job(
    "embed_memories_and_messages", "Embed new memories and messages", unique="queued", timeout=_time_limit
)
def embed_queued() -> dict[str, Any]:
    """Write the vectors of the memories and messages waiting in embedding_queue, a committed batch at a time.

    With no vector support in the database it drops them: `flask memories reindex` writes every missing vector
    once there is."""
    if not search.backend().vectors_available():
        dropped = db.session.execute(sa.delete(EmbeddingQueue)).rowcount
        db.session.commit()
        return {"dropped": dropped, "vectors": f"not available ({no_vectors_reason()})"}
    counts = {"memories": 0, "messages": 0, "left_for_later": 0}
    while batch := _next_batch():
        priority.after_replies()  # a reply building its prompt in this process goes first
        # A commit after each kind: SQLite would keep the cost ledger's own connection out of an open write.
        counts["memories"] += indexing.index_memories([row.row_id for row in batch if row.kind == "memory"])
        db.session.commit()
        counts["messages"] += indexing.index_messages([row.row_id for row in batch if row.kind == "message"])
        drained = _drain(batch)
        db.session.commit()
        if not drained:  # each row was written again meanwhile, or a writer holds it: its own run takes it
            counts["left_for_later"] = len(batch)
            break
    return counts


@recorded_job("find_waiting_embeddings", "Find memories and messages waiting for vectors", unique="active")
def queue_waiting() -> dict[str, int]:
    """Queue an embedding run if rows wait (hourly): what a failed run, or one skipped while another held the
    lock, left in embedding_queue; and the re-embedding of each account whose new embedder's vectors are not
    all written yet. Each write and each choice queues its own run; this only catches what slipped through."""
    rows = waiting()
    if rows:
        enqueue(embed_queued)
    changing = db.session.scalars(sa.select(Account.id).where(Account.embedding_searched.is_not(None))).all()
    for account_id in changing:
        enqueue(embed_for_new_model, account_id)
    db.session.commit()
    return {"waiting": rows, **({"changing_embedder": len(changing)} if changing else {})}


def choose(account: Account, choice: str | None) -> bool:
    """Make `choice` ("<ref>|<model>", None: the EMBEDDING_* settings) the account's embedder; True when its
    vectors are to be written (a run queued, committed by the caller). Search keeps ranking by the vectors it
    ranks by now until every memory and message has one of the new model (embed_for_new_model), never a mix;
    choosing back the model it ranks by ends that at once."""
    searched = account.embedding_searched or account.embedding_choice or f"{embedder.DEFAULT}|"
    ranked_by = embedder.searched(account).name
    account.embedding_choice = choice
    if embedder.chosen(account).name == ranked_by:
        indexing.switch(account)  # drops what a change now abandoned wrote
        return False
    account.embedding_searched = searched
    enqueue(embed_for_new_model, account.id)
    return True


@recorded_job(
    "embed_for_new_model",
    "Embed everything again for a new search model",
    lambda account_id: job_target(account=account_id),
    of=Account,
    unique="active",
    timeout=_time_limit,
)
def embed_for_new_model(account_id: int) -> dict[str, Any]:
    """Write the vectors of the account's chosen embedder that its memories and messages lack, a committed batch
    at a time (a stopped run goes on where it stopped); once none lacks one, its search ranks by them."""
    account = db.session.get(Account, account_id)
    if account is None:
        return {"skipped": "the account is gone"}
    if not search.backend().vectors_available():
        indexing.switch(account)  # nothing is searched by meaning here: the choice holds for when it can be
        db.session.commit()
        return {"vectors": f"not available ({no_vectors_reason()})"}
    counts = indexing.fill(account)
    while counts.get("superseded"):  # chosen again while this ran: that choice's run would find it running
        counts = indexing.fill(account)
    return counts


def _next_batch() -> list[sa.Row]:
    """The oldest waiting rows: id, kind, row_id, created_at."""
    columns = (EmbeddingQueue.id, EmbeddingQueue.kind, EmbeddingQueue.row_id, EmbeddingQueue.created_at)
    return list(db.session.execute(sa.select(*columns).order_by(EmbeddingQueue.id).limit(BATCH)))


def _drain(batch: list[sa.Row]) -> int:
    """Delete the batch's queue rows that were not written again since they were read; how many went.

    A row that a writer holds (PostgreSQL) is skipped rather than waited for: that writer is about to mark it
    changed. SQLite has one writer at a time, and this transaction is it by now."""
    seen = {row.id: row.created_at for row in batch}
    current = db.session.execute(
        sa.select(EmbeddingQueue.id, EmbeddingQueue.created_at)
        .where(EmbeddingQueue.id.in_(list(seen)))
        .with_for_update(skip_locked=True)
    ).all()
    done = [row.id for row in current if seen[row.id] == row.created_at]
    if done:
        db.session.execute(sa.delete(EmbeddingQueue).where(EmbeddingQueue.id.in_(done)))
    return len(done)


def no_vectors_reason() -> str:
    """Why this database cannot hold vectors, in words for an admin."""
    if db.engine.dialect.name == "sqlite":
        return "the database has no vector extension: sqlite-vec cannot be loaded into this SQLite"
    return "the database has no vector extension: pgvector is not installed in this PostgreSQL"


def waiting() -> int:
    """How many memories and messages wait for their vectors."""
    return db.session.scalar(sa.select(sa.func.count()).select_from(EmbeddingQueue))
