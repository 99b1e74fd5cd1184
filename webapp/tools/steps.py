"""How a tool call shows in the chat: a step while it runs ("Saving a memory…"), then a chip saying what it did,
linked to the memory saved or the conversation borrowed from. Stored on the reply as plain JSON. Each tool says
its own words (Tool.label, Tool.chip, Tool.failure); a tool that says none shows as "Using …", "Used …".

A step or chip names (and links) another conversation only when it may be heard in the chat it shows in
(webapp.tools.base.chat_named): whatever id the model wrote, no one there learns another chat's title."""

from typing import Any

from webapp.models import Chat
from webapp.tools import REGISTRY
from webapp.tools.base import Tool, cut
from webapp.tools.borrow_context import UNNAMED_CHIP, UNNAMED_LABEL

__all__ = ["UNNAMED_CHIP", "finished", "may_name_a_chat", "running", "unnamed"]


def running(name: str, arguments: dict[str, Any], chat: Chat, tool: Tool | None = None) -> dict[str, Any]:
    """The step shown in `chat` while the tool runs (`tool`: the one offered by that name, a tool server's
    among them; by default the registry's)."""
    tool = tool or REGISTRY.get(name)
    label = tool.label(arguments, chat) if tool and tool.label else f"Using {name.replace('_', ' ')}…"
    return {"tool": name, "state": "running", "label": label}


def finished(
    name: str, arguments: dict[str, Any], result: dict[str, Any], chat: Chat, tool: Tool | None = None
) -> dict[str, Any]:
    """The chip shown in `chat` once the tool returned `result`."""
    tool = tool or REGISTRY.get(name)
    if "error" in result:
        failure = tool.failure if tool and tool.failure else name
        return {"tool": name, "state": "failed", "chip": f"Could not {failure}: {cut(result['error'])}"}
    if tool and tool.chip:
        return {"tool": name, "state": "done", **tool.chip(arguments, result, chat)}
    return {"tool": name, "state": "done", "chip": f"Used {name.replace('_', ' ')}"}


def may_name_a_chat(step: dict[str, Any]) -> bool:
    """Whether the step's text may hold another conversation's title: a step of a tool that says it may
    (Tool.names_a_chat: borrow_context) that did not fail."""
    tool = REGISTRY.get(step.get("tool") or "")
    return tool is not None and tool.names_a_chat and step.get("state") != "failed"


def unnamed(step: dict[str, Any]) -> dict[str, Any]:
    """The step as someone who may not read the conversation it names sees it: without that conversation's
    title (a running step has no chat_id to ask about, so it is said this way to whoever may not ask)."""
    if step.get("state") == "running":
        return {**step, "label": UNNAMED_LABEL}
    return {**step, "chip": UNNAMED_CHIP}
