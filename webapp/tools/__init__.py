"""Tools an agent may call, in one registry: in a reply (those enabled for it), or refine_memory in refinement.

One module per tool, whose TOOL the registry finds (discover): a new tool is its own file. This is the one place
a call is checked and run.

A tool's result always goes back to the model as JSON. Bad calls (an unknown or disabled tool, arguments that
are not JSON or do not fit the schema) get an error result the model can read and correct, never an exception.
"""

import importlib
import pkgutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema

from webapp.llm import ToolCall
from webapp.models import Agent, Chat
from webapp.models.agents import DEFAULT_TOOLS
from webapp.tools.base import Tool, ToolContext
from webapp.tools.from_servers import down_notice, offered_tools
from webapp.tools.refinement import RefinementSession

# Every tool, by name, and those an agent may enable for its replies: filled by discover(), in place.
REGISTRY: dict[str, Tool] = {}
REPLY_TOOLS: dict[str, Tool] = {}


def discover() -> None:
    """Fill the registry with the TOOL of every module of this package, so a new tool is one new file: the agents'
    default tools first, in their order (the order the agent form lists and a prompt offers them), then the
    others by name."""
    found = []
    for module in pkgutil.iter_modules(__path__, f"{__name__}."):
        tool = getattr(importlib.import_module(module.name), "TOOL", None)
        if isinstance(tool, Tool):
            found.append(tool)
    defaults = list(DEFAULT_TOOLS)
    found.sort(key=lambda t: (defaults.index(t.name) if t.name in defaults else len(defaults), t.name))
    REGISTRY.clear()
    REGISTRY.update((tool.name, tool) for tool in found)
    REPLY_TOOLS.clear()
    REPLY_TOOLS.update((name, tool) for name, tool in REGISTRY.items() if tool.in_replies)


discover()

__all__ = [
    "REGISTRY",
    "REPLY_TOOLS",
    "RefinementSession",
    "ReplyTools",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "reply_tools",
    "run_tool_call",
    "schemas_for",
]


@dataclass
class ReplyTools:
    """What a reply offers: tools by name; and a step for each tool server left out because it is down."""

    tools: dict[str, Tool]
    unavailable: list[dict[str, Any]]


def reply_tools(agent: Agent, chat: Chat) -> ReplyTools:
    """The tools the agent's replies in the chat offer: the built-in reply tools enabled for it, in registry
    order (in a temporary chat, none that keeps anything of it), then its enabled tools of the account's tool
    servers (MCP) whose server is not down (webapp.tool_servers)."""
    enabled = agent.enabled_tools or []
    built_in = {
        name: tool
        for name, tool in REPLY_TOOLS.items()
        if name in enabled and (chat.remembers or not tool.remembers)
    }
    served, down = offered_tools(agent)
    return ReplyTools(built_in | served, down_notice(down))


def schemas_for(tools: Iterable[Tool]) -> list[dict[str, Any]]:
    """The OpenAI `tools` list for the offered tools, in their order."""
    return [tool.schema() for tool in tools]


@dataclass
class ToolOutcome:
    name: str
    result: dict[str, Any]

    @property
    def ok(self) -> bool:
        return "error" not in self.result


def run_tool_call(
    call: ToolCall, context: ToolContext | RefinementSession, offered: Mapping[str, Tool]
) -> ToolOutcome:
    """Validate and run one call of an offered tool in its context (a reply's, or a refinement session);
    every failure becomes an error result."""
    tool = offered.get(call.name)
    if tool is None:
        available = ", ".join(sorted(offered)) or "none"
        return ToolOutcome(
            call.name, {"error": f"You have no tool named {call.name!r}. Available: {available}."}
        )
    try:
        arguments = call.parsed_arguments()
        jsonschema.validate(arguments, tool.parameters)
    except ValueError as e:
        return ToolOutcome(call.name, {"error": f"Invalid arguments for {call.name}: {e}"})
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "arguments"
        return ToolOutcome(call.name, {"error": f"Invalid arguments for {call.name}: {where}: {e.message}"})
    return ToolOutcome(call.name, tool.run(context, **arguments))
