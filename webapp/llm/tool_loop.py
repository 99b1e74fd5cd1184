"""The one tool loop, for replies and refinement sessions alike: ask the model, run the tools it calls, feed
the results back, until it answers without a tool call, the caller says it is finished, or the turns run out.

Each turn is one llm.complete call (so one llm_calls row). No database transaction is held while the model
thinks. The caller runs each call (tools.run_tool_call) and says what to show while the model writes.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from webapp import llm
from webapp.extensions import db
from webapp.llm import ToolCall
from webapp.llm.targets import ModelTarget


@dataclass
class Transcript:
    """What the model has written so far in one loop, and what it cost."""

    turns: list[str] = field(default_factory=list)  # the text of each finished turn
    streaming: list[str] = field(default_factory=list)  # the deltas received so far of the turn being written
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def text(self) -> str:
        """Everything written so far (the turn being streamed included), a paragraph per turn."""
        return "\n\n".join(t.strip() for t in [*self.turns, "".join(self.streaming)] if t.strip())


def run_tool_loop(
    target: ModelTarget,
    messages: list[dict[str, Any]],
    *,
    purpose: str,
    tools: list[dict[str, Any]],
    run_call: Callable[[ToolCall, Transcript], dict[str, Any]],
    max_turns: int,
    agent_id: int,
    chat_id: int | None = None,
    tools_on_last_turn: bool = True,
    before_turn: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], Any] | None = None,
    on_text: Callable[[str, Transcript], None] | None = None,
    finished: Callable[[], bool] | None = None,
) -> Transcript:
    """Run the loop on `messages` (extended in place with the calls and their results).

    run_call(call, transcript) returns the call's JSON-able result. before_turn(messages, tools) may trim the
    prompt before each request, knowing the tools sent with it (None on a last turn that offers none). With
    on_text(delta, transcript) the model streams, and transcript.text is what came
    before this delta. tools_on_last_turn=False leaves tools out of the last turn, so it has to answer.
    """
    transcript = Transcript()
    stream = _streamer(on_text, transcript) if on_text else None
    for turn in range(max_turns):
        db.session.commit()  # hold no transaction (and no SQLite lock) while the model thinks
        offered = tools_on_last_turn or turn < max_turns - 1
        sent_tools = tools if tools and offered else None
        if before_turn:
            before_turn(messages, sent_tools)
        result = llm.complete(
            target,
            messages,
            purpose=purpose,
            tools=sent_tools,
            agent_id=agent_id,
            chat_id=chat_id,
            on_text=stream,
        )
        transcript.streaming = []  # now one of the turns
        transcript.prompt_tokens += result.prompt_tokens
        transcript.completion_tokens += result.completion_tokens
        transcript.turns.append(result.text)
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
            content = json.dumps(run_call(call, transcript))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
        if finished and finished():
            break
    return transcript


def _streamer(on_text: Callable[[str, Transcript], None], transcript: Transcript) -> Callable[[str], None]:
    def stream(delta: str) -> None:
        on_text(delta, transcript)
        transcript.streaming.append(delta)

    return stream
