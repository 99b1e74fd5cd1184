"""The refinement tool (spec 002), refine_memory, as its model sees it: one polymorphic tool an agent uses on its
own core memory during a refinement session (webapp.tools.refinement.RefinementSession, its context). It is never
in an agent's enabled tools; only the refinement job offers it."""

from typing import Any

from webapp.tools.base import Tool
from webapp.tools.refinement import RefinementSession
from webapp.tools.refinement_results import ACTIONS


def refine_memory(session: RefinementSession, **arguments: Any) -> dict[str, Any]:
    """Run one refine_memory call in its session."""
    return session.run(arguments)


NUMBERS = ["string", "integer"]  # a memory or page number, as text or as a number


TOOL = Tool(
    name="refine_memory",
    description="Memory refinement tool. Actions: page, search, consolidate, update, delete, protect, complete.",
    parameters={
        "type": "object",
        "properties": {
            "action": {
                "type": "string",
                "enum": list(ACTIONS),
                "description": "page, search, consolidate, update, delete, protect, or complete",
            },
            "page": {"type": NUMBERS, "description": "Page number of your core memories (for page)"},
            "query": {"type": "string", "description": "Search query (for search action)"},
            "ids": {"type": NUMBERS, "description": "Comma-separated memory IDs (for consolidate, delete)"},
            "id": {"type": NUMBERS, "description": "Single memory ID (for update, delete, protect)"},
            "content": {"type": "string", "description": "New content (for consolidate, update)"},
            "summary": {"type": "string", "description": "Refinement summary (for complete)"},
        },
        "required": ["action"],
    },
    run=refine_memory,
    in_replies=False,
)
