"""A reply's tool loop, streamed to the chat page as the model writes it, and the Stop that cuts it short."""

import logging
import time
from collections.abc import Callable
from typing import Any

from flask import current_app
from redis.exceptions import RedisError

from webapp import events, llm
from webapp.extensions import db
from webapp.jobs.queue import redis_connection
from webapp.jobs.refinement import trigger_if_over_budget
from webapp.llm.tool_loop import Transcript, run_tool_loop
from webapp.models import Message
from webapp.prompting.build import Prompt
from webapp.prompting.window import fit_to_budget
from webapp.tools import ToolContext, run_tool_call, schemas_for
from webapp.tools import steps as tool_steps

log = logging.getLogger(__name__)
STOP_FLAG_SECONDS = 1_800  # a Stop outlives any reply it could stop
# Streamed text goes to the chat page at most this often: a model streaming token by token would otherwise send
# an event per token, and every open page re-renders the reply's markdown for each. The first token goes at once;
# text held back is sent with the next token past the interval, or shown by the reply's final event.
DELTA_INTERVAL_SECONDS = 0.1


class ReplyStopped(Exception):
    """The person pressed Stop while this reply was being generated."""


def stop_key(message_id: int) -> str:
    return f"cairn:stop:{message_id}"


def stop_requested(message_id: int) -> bool:
    """Whether Stop was pressed; while Redis is unreachable (restarting), the reply goes on."""
    try:
        return bool(redis_connection().exists(stop_key(message_id)))
    except RedisError as error:
        log.warning("Stop flag of message %s not readable, going on: %s", message_id, error)
        return False


def stream_tool_loop(message: Message, prompt: Prompt) -> tuple[str, int, int]:
    """The agent's tool loop, streamed to the page; the last turn offers no tools.

    Text written before a tool call is kept (it starts the reply), and each call shows on the page as a step,
    then as a chip saying what it did (message.tools_used). Stop raises ReplyStopped with the text so far.
    """
    chat, agent = message.chat, message.agent
    offered = prompt.tools.tools
    context = ToolContext(agent=agent, chat=chat, message=message)
    steps: list[dict[str, Any]] = list(prompt.tools.unavailable)  # "time is down: … without its tools"
    if steps:
        _show_progress(message, "", steps)

    def run_call(call: llm.ToolCall, transcript: Transcript) -> dict[str, Any]:
        try:
            arguments = call.parsed_arguments()
        except ValueError:
            arguments = {}
        tool = offered.get(call.name)
        steps.append(tool_steps.running(call.name, arguments, chat, tool))
        _show_progress(message, transcript.text, steps)
        outcome = run_tool_call(call, context, offered)
        if outcome.result.get("saved"):  # save_memory added a memory: it may have gone over budget
            trigger_if_over_budget(agent)
        steps[-1] = tool_steps.finished(call.name, arguments, outcome.result, chat, tool)
        _show_progress(message, transcript.text, steps)
        return outcome.result

    transcript = run_tool_loop(
        prompt.target,
        prompt.messages,
        purpose="reply",
        tools=schemas_for(offered.values()),
        run_call=run_call,
        max_turns=current_app.config["REPLY_MAX_TOOL_TURNS"],
        agent_id=agent.id,
        chat_id=chat.id,
        tools_on_last_turn=False,
        # tool results may have grown the prompt since the last call
        before_turn=lambda messages, tools: fit_to_budget(prompt.target, messages, tools),
        on_text=_relay(message),
    )
    return transcript.text, transcript.prompt_tokens, transcript.completion_tokens


def _relay(message: Message) -> Callable[[str, Transcript], None]:
    """Publish the streamed text to the chat page, at most every DELTA_INTERVAL_SECONDS, and look for a Stop as
    often; on Stop, raise with the text written so far."""
    unsent: list[str] = []
    sent_at = float("-inf")
    message_id, chat_id = message.id, message.chat_id  # read now: the tool loop's commits expire the message

    def on_text(delta: str, transcript: Transcript) -> None:
        nonlocal sent_at
        unsent.append(delta)
        now = time.monotonic()
        if now - sent_at < DELTA_INTERVAL_SECONDS:
            return
        if stop_requested(message_id):
            raise ReplyStopped(transcript.text)
        events.publish(chat_id, "delta", message_id, "".join(unsent))
        unsent.clear()
        sent_at = now

    return on_text


def _show_progress(message: Message, text: str, steps: list[dict[str, Any]]) -> None:
    """Store the text so far and the tool steps on the unfinished reply, and show them on the page."""
    message.content, message.tools_used = text, [dict(s) for s in steps]
    db.session.commit()
    events.publish(message.chat_id, "final", message.id)
