"""Agent replies: the job that answers a chat, each asked agent on its own model (the streamed loop: reply_stream)."""

import logging
from typing import Any

import sqlalchemy as sa
from flask import current_app
from rq import get_current_job
from rq.timeouts import JobTimeoutException
from sqlalchemy.orm import joinedload

from webapp import events
from webapp.extensions import db
from webapp.jobs import embeddings
from webapp.jobs.followups import after_new_message
from webapp.jobs.queue import (
    enqueue,
    held_lock,
    job_target,
    lock_holder,
    model_time,
    recorded_job,
    redis_connection,
    target_ids,
    timed_out,
)
from webapp.jobs.reply_stream import (
    STOP_FLAG_SECONDS,
    ReplyStopped,
    stop_key,
    stop_requested,
    stream_tool_loop,
)
from webapp.llm import LLMError
from webapp.models import Agent, Chat, JobRun, Message
from webapp.models.runs import current_job_run_id
from webapp.prompting.build import build_prompt
from webapp.prompting.provenance import record_sources
from webapp.runtime import priority
from webapp.timeutil import utcnow

log = logging.getLogger(__name__)
WAITING = ("pending", "streaming")


class ReplyFailed(Exception):
    """Some replies of a job failed for good; each message already shows its own reason."""


def _target(message_ids: list[int]) -> str:
    return job_target(messages=message_ids)


def _message_ids(target: str | None) -> list[int]:
    return target_ids(target, "messages")


def _interrupted(run: JobRun, again: bool) -> None:
    """Its worker died mid-reply: each unfinished reply waits for the new attempt, or fails with Retry."""
    if again:
        _leave_unfinished(
            _message_ids(run.target), "pending", "The worker writing this reply stopped; trying again."
        )
    else:
        reason = "The worker writing this reply stopped again; Retry when the model is reachable."
        _leave_unfinished(_message_ids(run.target), "failed", reason)


def _leave_unfinished(message_ids: list[int], status: str, reason: str) -> None:
    """Mark the replies among these still waiting or being written (a Retry works on a failed one)."""
    unfinished = db.session.scalars(
        sa.select(Message).where(Message.id.in_(message_ids), Message.status.in_(WAITING))
    ).all()
    for message in unfinished:
        message.status, message.error = status, reason
    db.session.commit()
    for message in unfinished:
        events.publish(message.chat_id, "final", message.id)


def _time_limit(message_ids: list[int]) -> int:
    """Each reply may take its whole tool loop, one model request per turn."""
    return model_time(len(message_ids) * current_app.config["REPLY_MAX_TOOL_TURNS"])


@recorded_job(
    "reply",
    "Reply",
    target=_target,
    of=Message,
    queue="replies",
    on_interrupt=_interrupted,
    timeout=_time_limit,
)
def respond(message_ids: list[int]) -> dict[str, int]:
    """Generate the pending replies in order (one agent, or "ask all"); each sees the replies before it. Their
    vectors' run is queued once the run is closed, off the path of the person waiting."""
    with embeddings.run_queued_after():
        try:
            return _respond(message_ids)
        except (
            JobTimeoutException
        ):  # RQ stopped the job: what it had not finished fails, with a working Retry
            db.session.rollback()
            _leave_unfinished(message_ids, "failed", f"{timed_out()} Retry to ask again.")
            raise


def _respond(message_ids: list[int]) -> dict[str, int]:
    answered, failed, todo = 0, set(), message_ids
    while todo:  # then the replies of this job retried while it ran (Retry left them to it)
        for message_id in todo:
            outcome = _answer(message_id)
            if outcome == "answered":
                answered += 1
                failed.discard(message_id)
            elif outcome == "failed":
                failed.add(message_id)
        todo = _retried_meanwhile(message_ids)
    if failed:
        raise ReplyFailed(f"replies failed: {', '.join(map(str, sorted(failed)))}")
    return {"replies": answered}


def _answer(message_id: int) -> str | None:
    """Generate this reply if it still waits for it: "answered", "failed" (its message says why), or None."""
    message = _reread(message_id)
    if message is None or message.status not in WAITING:
        return None  # answered by an earlier attempt, or failed for good (Retry asks again)
    if stop_requested(message_id):
        return None  # stopped before its turn came; the stop marked it
    if message.agent.paused:
        _unfinished(message, f"{message.agent.name} was paused before answering.", False)
        return None
    with held_lock(_claim(message_id)) as mine:
        if not mine:
            return None  # another job is generating this very reply right now
        try:
            generate_reply(message)
            return "answered"
        except LLMError as error:
            if error.retryable and _retries_left() > 0:
                raise  # RQ retries the job with backoff; finished replies are skipped then
        except JobTimeoutException:
            raise
        except Exception:  # generate_reply has marked the reply failed; the next agents still answer
            log.exception("reply %s failed", message_id)
        return "failed"


def _retried_meanwhile(message_ids: list[int]) -> list[int]:
    """Close this job's run, unless one of its replies was retried while it ran: those, to answer now.

    Retry leaves a reply to a queued or running job that covers it (see retry_reply). The run's row is written
    before the replies are read, in one transaction, so a Retry either comes first and is seen here, or waits
    for this to commit and then sees the run finished and queues a job of its own."""
    run_id = current_job_run_id.get()
    db.session.execute(
        sa.update(JobRun)
        .where(JobRun.id == run_id)
        .values(status="done", finished_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    pending = set(
        db.session.scalars(
            sa.select(Message.id).where(Message.id.in_(message_ids), Message.status == "pending")
        )
    )
    retried = [
        i for i in message_ids if i in pending and not stop_requested(i) and lock_holder(_claim(i)) is None
    ]
    if retried:
        db.session.rollback()  # still running: it answers them
    else:
        db.session.commit()
    return retried


def _claim(message_id: int) -> str:
    return f"reply:{message_id}"


def _reread(message_id: int) -> Message | None:
    """The reply's message as the database holds it now, with its chat, agent and sources, in one statement (read
    one by one once a commit expired them, they took four)."""
    return db.session.scalar(
        sa.select(Message)
        .where(Message.id == message_id)
        .options(
            joinedload(Message.chat),
            # The agent's account: which embedder a prompt's search asks (webapp.search.embedder.for_search).
            joinedload(Message.agent).joinedload(Agent.account),
            joinedload(Message.sources),
        )
        .execution_options(populate_existing=True)
    )


def generate_reply(message: Message) -> None:
    """Run the agent's tool loop for this placeholder message and store the final answer (or the failure)."""
    message.status, message.error, message.content, message.tools_used = "streaming", None, "", None
    message_id, chat_id = message.id, message.chat_id
    db.session.commit()
    events.publish(chat_id, "final", message_id)  # its turn: the page shows who is thinking now
    stopped = False
    try:
        with priority.reply_building():
            _reread(message_id)  # as the commit left it, with its chat and agent, in one statement
            prompt = build_prompt(message.chat, message.agent, before_message_id=message_id)
        text, prompt_tokens, completion_tokens = stream_tool_loop(message, prompt)
        _reread(message_id)  # the tool loop commits before each model call
        if not text.strip():
            raise LLMError("The model kept calling tools and never wrote an answer.", retryable=False)
    except ReplyStopped as stop:
        stopped, text, prompt_tokens, completion_tokens = True, str(stop), 0, 0
        redis_connection().delete(stop_key(message.id))
        if not text.strip():
            _unfinished(message, "Stopped before it said anything.", False)
            return
    except LLMError as error:
        will_retry = error.retryable and _retries_left() > 0
        _unfinished(message, f"{error} Trying again shortly." if will_retry else str(error), will_retry)
        raise
    except JobTimeoutException:
        raise  # respond fails this reply and the ones after it
    except Exception:
        db.session.rollback()
        _unfinished(message, "Cairn could not build this reply (an internal error was logged).", False)
        raise
    message.content = text.strip()
    message.status = "done"
    message.error = "Stopped." if stopped else None
    message.input_tokens, message.output_tokens = prompt_tokens, completion_tokens
    record_sources(message, prompt)
    _after_success(message, prompt.borrowed_context)
    db.session.commit()
    events.publish(chat_id, "final", message_id)


def _after_success(message: Message, borrowed_context: dict[str, Any] | None) -> None:
    """Clear the borrowed context this prompt included and queue the follow-up jobs, with the finished reply."""
    # Only what the prompt included: context the agent staged during this reply is for its next one.
    mine = next((ca for ca in message.chat.chat_agents if ca.agent_id == message.agent_id), None)
    if mine is not None:
        mine.clear_borrowed_context(borrowed_context)
    after_new_message(message.chat)


def _unfinished(message: Message, reason: str, will_retry: bool) -> None:
    """Show the reply as waiting for a retry, or as failed with its reason; streamed text is discarded."""
    message.status = "pending" if will_retry else "failed"
    message.error = reason
    db.session.commit()
    events.publish(message.chat_id, "final", message.id)


def _retries_left() -> int:
    job = get_current_job()
    return (job.retries_left or 0) if job else 0


def request_replies(chat: Chat, agents: list[Agent]) -> list[Message]:
    """Add a pending reply per agent, in this order, and one queued job that answers them once committed."""
    if not agents:
        return []
    placeholders = [chat.add_message(role="assistant", agent=agent, status="pending") for agent in agents]
    db.session.flush()
    enqueue(respond, [p.id for p in placeholders])
    return placeholders


def retry_refusal(message: Message, stuck: bool) -> str | None:
    """Why this reply cannot be queued again now, or None: only a failed reply, or a stuck one that no job
    is writing or waiting to write, and never while its agent is paused (two generations must not race)."""
    if message.role != "assistant" or message.agent is None:
        return "Only a reply can be retried."
    if message.agent.paused:
        return f"{message.agent.name} is paused; unpause the agent to ask again."
    if message.status == "failed":
        return None
    if message.status not in WAITING or not stuck:
        return "Only a failed or stuck reply can be retried."
    if lock_holder(_claim(message.id)) is not None:
        return "This reply is still being written."
    if _waiting_runs(message.id):
        return "This reply is already waiting for a worker."
    return None


def _waiting_runs(message_id: int, *, locked: bool = False) -> list[JobRun]:
    """The unfinished reply runs that cover this message (locked: their rows, until the transaction ends)."""
    covering = sa.or_(
        JobRun.target == _target([message_id]),
        JobRun.target.startswith(f"{_target([message_id])},"),
        JobRun.target.endswith(f",{message_id}"),
        JobRun.target.contains(f",{message_id},"),
    )
    query = sa.select(JobRun).where(
        JobRun.job_type == "reply", JobRun.status.in_(("queued", "running")), covering
    )
    return list(db.session.scalars(query.with_for_update() if locked else query))


def retry_reply(message: Message) -> None:
    """Ask for a failed, stuck or finished reply again (Retry, Regenerate), once the caller has checked that
    no job is writing it. A job that covers it and has not finished answers it (a reply stopped while it waited
    for its turn, say): never two jobs for one reply."""
    message.status, message.error, message.content, message.tools_used = "pending", None, "", None
    redis_connection().delete(stop_key(message.id))
    # Write first: a job closing its run (_retried_meanwhile) then either sees this reply pending, or has
    # closed before this reads the runs (SQLite: one writer at a time; PostgreSQL: the run's row lock).
    db.session.flush()
    if not _waiting_runs(message.id, locked=True):
        enqueue(respond, [message.id])


def stop_reply(message: Message) -> None:
    """Stop a reply: a queued one is marked stopped now; one being generated stops at its next token."""
    redis_connection().set(stop_key(message.id), "1", ex=STOP_FLAG_SECONDS)
    if message.status == "pending":
        message.status, message.error = "failed", "Stopped before it began."
