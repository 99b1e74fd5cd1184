"""What a finished reply drew on: its prompt's sources, and what its recall and borrow_context calls brought in."""

import json
from typing import Any

from webapp.extensions import db
from webapp.models import Message, ReplySources, public_ids
from webapp.prompting.build import Prompt


def record_sources(message: Message, prompt: Prompt) -> ReplySources:
    """Record what the finished reply's prompt held, including what the recall and borrow_context tools brought
    into it (a borrow during the reply is the one its words may quote; a staged borrow was itself recorded by
    the reply that made it)."""
    recalled_memories, recalled_chats = _recalled(prompt.messages)
    sources = message.sources or ReplySources(message=message)
    sources.memory_ids = prompt.sources.memory_ids
    sources.recalled_memory_ids = recalled_memories
    sources.recalled_chat_ids = recalled_chats
    sources.conversation_summary = prompt.sources.conversation_summary
    sources.summary_chat_ids = prompt.sources.summary_chat_ids
    sources.borrowed_chat_id = _borrowed_in_reply(prompt.messages) or prompt.sources.borrowed_chat_id
    db.session.add(sources)
    return sources


def _tool_results(messages: list[dict[str, Any]], tool: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The (arguments, result) of each call of `tool` whose result is still in the messages (the model saw it)."""
    calls = {
        call["id"]: call["function"]["arguments"]
        for message in messages
        for call in message.get("tool_calls") or []
        if call["function"]["name"] == tool
    }
    found = []
    for message in messages:
        if message["role"] == "tool" and message.get("tool_call_id") in calls:
            arguments = calls[message["tool_call_id"]]
            found.append((_json_object(arguments), _json_object(message["content"])))
    return found


def _json_object(text: Any) -> dict[str, Any]:
    """A tool call's arguments or result as a dict ({} when it is not a JSON object)."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _borrowed_in_reply(messages: list[dict[str, Any]]) -> int | None:
    """The chat the reply's last successful borrow_context call read, if it made one."""
    borrowed = [
        public_ids.decode(str(arguments.get("conversation_id", "")))
        for arguments, result in _tool_results(messages, "borrow_context")
        if result.get("success")
    ]
    return next((chat_id for chat_id in reversed(borrowed) if chat_id is not None), None)


def _recalled(messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """The memory ids and chat ids of the recall results still in the messages (the model saw these)."""
    memory_ids: list[int] = []
    chat_ids: list[int] = []
    for _, result in _tool_results(messages, "recall"):
        for hit in result.get("results", []):
            if "memory_id" in hit and hit["memory_id"] not in memory_ids:
                memory_ids.append(hit["memory_id"])
            chat_id = public_ids.decode(hit.get("conversation_id", ""))
            if chat_id is not None and chat_id not in chat_ids:
                chat_ids.append(chat_id)
    return memory_ids, chat_ids
