"""What the refinement tool answers its model, besides what it did: its actions, errors that list them, refusals
of constitutional or unlisted memories, a memory as the model reads it, and memory ids parsed from its words."""

from typing import Any

from webapp.models import AgentMemory

ACTIONS = ("page", "search", "consolidate", "update", "delete", "protect", "complete")


def constitutional_refusal(verb: str, memories: list[AgentMemory]) -> dict[str, Any] | None:
    """The error result when any of the memories is constitutional (they cannot be deleted or merged)."""
    protected = [m.id for m in memories if m.constitutional]
    if not protected:
        return None
    return error_result(f"Cannot {verb} constitutional memories: {', '.join(map(str, protected))}")


def unlisted_refusal(wanted: list[int], memories: list[AgentMemory]) -> dict[str, Any] | None:
    """The error result when some memories to merge are not among those listed in the session (another
    agent's, deleted, or heard by other people than the memories this session is about)."""
    missing = sorted(set(wanted) - {m.id for m in memories})
    if not missing:
        return None
    listed = ", ".join(f"#{memory_id}" for memory_id in missing)
    return error_result(
        f"Cannot consolidate {listed}: not among the memories listed in this session. Consolidate only those."
    )


def parse_ids(text: str) -> list[int]:
    ids = [part.strip().lstrip("#") for part in text.split(",") if part.strip()]
    if not all(part.isdigit() for part in ids):
        raise ValueError(f"ids must be memory numbers separated by commas, not {text!r}")
    return [int(part) for part in ids]


def memory_summary(memory: AgentMemory) -> dict[str, Any]:
    return {
        "id": memory.id,
        "content": memory.content,
        "created_at": memory.created_at.isoformat(),
        "tokens": memory.token_estimate,
        "constitutional": memory.constitutional,
        "heard_by": memory.heard_by,
    }


def error_result(message: str) -> dict[str, Any]:
    return {"type": "error", "error": message, "allowed_actions": list(ACTIONS)}


def param_error(action: str, param: str) -> dict[str, Any]:
    return error_result(f"{param} is required for {action}")
