"""Tools an agent may call during a reply. One module per tool; this is the one place they are registered.

A tool's result always goes back to the model as JSON. Bad calls (an unknown or disabled tool, arguments that
are not JSON or do not fit the schema) get an error result the model can read and correct, never an exception.
"""

import json
from dataclasses import dataclass
from typing import Any

import jsonschema

from webapp.llm import ToolCall
from webapp.tools.base import Tool, ToolContext
from webapp.tools.borrow_context import TOOL as BORROW_CONTEXT
from webapp.tools.recall import TOOL as RECALL
from webapp.tools.save_memory import TOOL as SAVE_MEMORY

REGISTRY: dict[str, Tool] = {tool.name: tool for tool in [SAVE_MEMORY, RECALL, BORROW_CONTEXT]}

__all__ = ["REGISTRY", "Tool", "ToolContext", "ToolOutcome", "run_tool_call", "schemas_for"]


def schemas_for(names: list[str]) -> list[dict[str, Any]]:
    """The OpenAI `tools` list for the named (enabled) tools, in registry order."""
    return [tool.schema() for name, tool in REGISTRY.items() if name in names]


@dataclass
class ToolOutcome:
    name: str
    result: dict[str, Any]

    @property
    def ok(self) -> bool:
        return "error" not in self.result

    def as_message(self, call_id: str) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(self.result)}


def run_tool_call(call: ToolCall, context: ToolContext) -> ToolOutcome:
    """Validate and run one tool call for context.agent; every failure becomes an error result."""
    tool = REGISTRY.get(call.name)
    if tool is None or call.name not in context.agent.enabled_tools:
        available = ", ".join(sorted(n for n in context.agent.enabled_tools if n in REGISTRY)) or "none"
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
