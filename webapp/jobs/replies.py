"""Agent replies: a tool loop against the agent's own model, streamed to the chat page as it is generated."""

import logging
import uuid
from collections.abc import Callable
from typing import Any

from flask import current_app
from rq import get_current_job

from webapp import events, llm, tool_steps
from webapp.extensions import db
from webapp.jobs.followups import after_new_message
from webapp.llm import LLMError
from webapp.models import Agent, Chat, Message
from webapp.prompt import build_prompt, fit_to_budget, record_sources
from webapp.queue import enqueue, recorded_job, redis_connection
from webapp.tools import ToolContext, run_tool_call, schemas_for

log = logging.getLogger(__name__)
REPLY_CLAIM_SECONDS = 1_800  # longer than any reply takes; a killed worker's claim expires


class ReplyFailed(Exception):
    """Some replies of a job failed for good; each message already shows its own reason."""


class ReplyStopped(Exception):
    """The person pressed Stop while this reply was being generated."""


def _stop_key(message_id: int) -> str:
    return f"cairn:stop:{message_id}"


def stop_requested(message_id: int) -> bool:
    return bool(redis_connection().exists(_stop_key(message_id)))


def _target(message_ids: list[int]) -> str:
    return "messages:" + ",".join(str(i) for i in message_ids)


def _account(message_ids: list[int]) -> int | None:
    first = db.session.get(Message, message_ids[0]) if message_ids else None
    return first.chat.account_id if first else None


@recorded_job("reply", target=_target, account=_account)
def respond(message_ids: list[int]) -> dict[str, int]:
    """Generate the pending replies in order (one agent, or "ask all"); each sees the replies before it."""
    answered, failed = 0, []
    for message_id in message_ids:
        message = db.session.get(Message, message_id)
        if message is None or message.status == "done":
            continue  # already answered by an earlier attempt of this job
        if stop_requested(message_id):
            continue  # stopped before its turn came; the stop marked it
        claim = _claim(message_id)
        if claim is None:
            continue  # another worker is generating this reply right now (a retry of a slow one)
        try:
            generate_reply(message)
            answered += 1
        except LLMError as error:
            if error.retryable and _retries_left() > 0:
                raise  # RQ retries the job with backoff; finished replies are skipped then
            failed.append(message_id)
        except Exception:  # generate_reply has marked the reply failed; the next agents still answer
            log.exception("reply %s failed", message_id)
            failed.append(message_id)
        finally:
            _release(message_id, claim)
    if failed:
        raise ReplyFailed(f"replies failed: {', '.join(map(str, failed))}")
    return {"replies": answered}


def _claim(message_id: int) -> str | None:
    token = uuid.uuid4().hex
    claimed = redis_connection().set(f"cairn:replying:{message_id}", token, nx=True, ex=REPLY_CLAIM_SECONDS)
    return token if claimed else None


def _release(message_id: int, token: str) -> None:
    key = f"cairn:replying:{message_id}"
    if redis_connection().get(key) == token.encode():
        redis_connection().delete(key)


def generate_reply(message: Message) -> None:
    """Run the agent's tool loop for this placeholder message and store the final answer (or the failure)."""
    message.status, message.error, message.content, message.tools_used = "streaming", None, "", None
    db.session.commit()
    events.publish(message.chat_id, "final", message.id)  # its turn: the page shows who is thinking now
    stopped = False
    try:
        prompt = build_prompt(message.chat, message.agent, before_message_id=message.id)
        text, prompt_tokens, completion_tokens = _tool_loop(message, prompt.messages)
        if not text.strip():
            raise LLMError("The model returned an empty reply.", retryable=False)
    except ReplyStopped as stop:
        stopped, text, prompt_tokens, completion_tokens = True, str(stop), 0, 0
        redis_connection().delete(_stop_key(message.id))
        if not text.strip():
            _unfinished(message, "Stopped before it said anything.", False)
            return
    except LLMError as error:
        will_retry = error.retryable and _retries_left() > 0
        _unfinished(message, f"{error} Trying again shortly." if will_retry else str(error), will_retry)
        raise
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
    events.publish(message.chat_id, "final", message.id)


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


def _tool_loop(message: Message, messages: list[dict[str, Any]]) -> tuple[str, int, int]:
    """Ask the model, run the tools it calls, feed the results back; the last turn offers no tools.

    Text written before a tool call is kept (it starts the reply), and each call shows on the page as a step,
    then as a chip saying what it did (message.tools_used). Stop raises ReplyStopped with the text so far.
    """
    chat, agent = message.chat, message.agent
    tools = schemas_for(agent.enabled_tools)
    context = ToolContext(agent=agent, chat=chat, message=message)
    max_turns = current_app.config["REPLY_MAX_TOOL_TURNS"]
    prompt_tokens = completion_tokens = 0
    written: list[str] = []  # the text of finished turns
    steps: list[dict[str, Any]] = []
    for turn in range(max_turns):
        db.session.commit()  # hold no transaction (and no SQLite lock) while the model thinks
        fit_to_budget(messages)  # tool results may have grown the prompt since the last call
        result = llm.complete(
            agent.model_id,
            messages,
            purpose="reply",
            tools=tools if tools and turn < max_turns - 1 else None,
            agent_id=agent.id,
            chat_id=chat.id,
            on_text=_relay(message, written),
        )
        prompt_tokens += result.prompt_tokens
        completion_tokens += result.completion_tokens
        written.append(result.text)
        if not result.tool_calls:
            break
        messages.append(
            {
                "role": "assistant",
                "content": result.text or None,
                "tool_calls": [c.as_message_part() for c in result.tool_calls],
            }
        )
        for call in result.tool_calls:
            try:
                arguments = call.parsed_arguments()
            except ValueError:
                arguments = {}
            steps.append(tool_steps.running(call.name, arguments, chat.account_id))
            _show_progress(message, _joined(written), steps)
            outcome = run_tool_call(call, context)
            messages.append(outcome.as_message(call.id))
            steps[-1] = tool_steps.finished(call.name, arguments, outcome.result, chat.account_id)
            _show_progress(message, _joined(written), steps)
    return _joined(written), prompt_tokens, completion_tokens


def _relay(message: Message, written: list[str]) -> Callable[[str], None]:
    """Publish each streamed delta to the chat page; on Stop, raise with the text written so far."""
    streamed: list[str] = []

    def on_text(delta: str) -> None:
        if stop_requested(message.id):
            raise ReplyStopped(_joined([*written, "".join(streamed)]))
        streamed.append(delta)
        events.publish(message.chat_id, "delta", message.id, delta)

    return on_text


def _joined(texts: list[str]) -> str:
    return "\n\n".join(t.strip() for t in texts if t.strip())


def _show_progress(message: Message, text: str, steps: list[dict[str, Any]]) -> None:
    """Store the text so far and the tool steps on the unfinished reply, and show them on the page."""
    message.content, message.tools_used = text, [dict(s) for s in steps]
    db.session.commit()
    events.publish(message.chat_id, "final", message.id)


def _retries_left() -> int:
    job = get_current_job()
    return (job.retries_left or 0) if job else 0


def request_replies(chat: Chat, agents: list[Agent]) -> list[Message]:
    """Add a pending reply per agent, in this order, and enqueue one job that answers them once committed."""
    if not agents:
        return []
    placeholders = [chat.add_message(role="assistant", agent=agent, status="pending") for agent in agents]
    db.session.flush()
    enqueue(respond, [p.id for p in placeholders])
    return placeholders


def retry_reply(message: Message) -> None:
    """Put a failed, stuck or finished reply back in the queue (Retry, Regenerate); a stuck reply's claim died
    with its worker."""
    message.status, message.error, message.content, message.tools_used = "pending", None, "", None
    redis_connection().delete(f"cairn:replying:{message.id}", _stop_key(message.id))
    enqueue(respond, [message.id])


def stop_reply(message: Message) -> None:
    """Stop a reply: a queued one is marked stopped now; one being generated stops at its next token."""
    redis_connection().set(_stop_key(message.id), "1", ex=REPLY_CLAIM_SECONDS)
    if message.status == "pending":
        message.status, message.error = "failed", "Stopped before it began."
