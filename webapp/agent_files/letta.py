"""A Letta Agent File (.af) read as the cairn-agent document of the agent it describes, as far as its format
says: the format of Letta's `AgentFileSchema` (letta/schemas/agent_file.py; the examples of the letta-ai/agent-file
repository), `{"agents": [...], "blocks": [...], "tools": [...], ...}`, each agent naming its memory blocks by
`block_ids`.

- Each memory block of the agent (label, value) becomes a core memory, "label: value"; a read-only block
  (the agent cannot edit it) a constitutional one. A value longer than a memory holds is split at paragraphs.
- Its `system` becomes the system prompt, its `name` the name.
- Not read, as Cairn has no counterpart or the format does not carry it: archival memory (the format has no
  passages: Letta's README says so), the message history (it belongs to no Cairn chat), tools (code Cairn does
  not run; the agent gets Cairn's own), its model (Letta's provider settings; the agent gets this Cairn's
  default model).
"""

import re
from typing import Any

from flask import current_app

from webapp.agent_files.errors import AgentFileError
from webapp.agent_files.naming import iso
from webapp.agent_files.schema import FORMAT, VERSION, ref
from webapp.models.agents import DEFAULT_CORE_TOKEN_BUDGET, DEFAULT_TOOLS, NAME_MAX_CHARS
from webapp.models.memories import MAX_CONTENT_CHARS
from webapp.timeutil import utcnow

VIA = "letta-import"
MAX_LABEL_CHARS = 100  # Letta's labels are words ("persona", "human"); a memory keeps room for its text


def is_agent_file(document: dict[str, Any]) -> bool:
    """A Letta Agent File: a list of agents and a list of memory blocks."""
    return isinstance(document.get("agents"), list) and isinstance(document.get("blocks"), list)


def to_cairn(document: dict[str, Any]) -> dict[str, Any]:
    """The cairn-agent document of the one agent of a Letta file (refused when it holds none or several)."""
    agents = [agent for agent in document["agents"] if isinstance(agent, dict)]
    if len(agents) != 1:
        names = ", ".join(repr(agent.get("name")) for agent in agents) or "none"
        raise AgentFileError(
            f"The Letta file holds {len(agents)} agents ({names}); Cairn imports one at a time."
        )
    [agent] = agents
    blocks = {block.get("id"): block for block in document["blocks"] if isinstance(block, dict)}
    now = iso(utcnow())
    contents = []
    for block_id in agent.get("block_ids") or []:
        block = blocks.get(block_id)
        if block is None:
            raise AgentFileError(
                f"The Letta file's agent names memory block {block_id!r}, which it does not hold."
            )
        label, value = str(block.get("label") or "memory"), str(block.get("value") or "").strip()
        if len(label) > MAX_LABEL_CHARS:
            raise AgentFileError(
                f"The Letta file's memory block {block_id!r} has a label of {len(label):,} characters; Cairn "
                f"takes labels of at most {MAX_LABEL_CHARS}."
            )
        contents += [(part, bool(block.get("read_only"))) for part in _parts(label, value)]
    memories = [_memory(i, content, protected, now) for i, (content, protected) in enumerate(contents, 1)]
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": document.get("created_at") or now,
        "exported_by": None,
        "with_chats": False,
        "agent": _settings(agent, now),
        "memories": memories,
        "audit": [_creation(i, memory) for i, memory in enumerate(memories, 1)],
        "sessions": [],
        "chats": [],
    }


def _settings(agent: dict[str, Any], now: str) -> dict[str, Any]:
    name = _name(str(agent.get("name") or ""))
    return {
        "name": name,
        "slug": "",
        "system_prompt": str(agent.get("system") or "").strip(),
        "model_id": current_app.config["DEFAULT_MODEL_ID"],
        "enabled_tools": list(DEFAULT_TOOLS),
        "core_token_budget": DEFAULT_CORE_TOKEN_BUDGET,
        "memory_token_budget": None,
        "members_see_memory": "prompt",
        "consolidates_direct_chats": True,
        "paused": False,
        "last_refinement_at": None,
        "created_at": now,
        "updated_at": now,
    }


def _name(name: str) -> str:
    """The agent's name as the agent form takes it: what is not a letter, digit, space, dot, dash or apostrophe
    dropped, at most NAME_MAX_CHARS."""
    kept = re.sub(r"[^\w .'-]+", " ", name)
    kept = " ".join(re.sub(r"^[^\w]+", "", kept).split())[:NAME_MAX_CHARS].strip()
    return kept or "Letta agent"


def _parts(label: str, value: str) -> list[str]:
    """A block as memories of at most MAX_CONTENT_CHARS, "label: value" (split at paragraphs, or hard, when
    too long: "label (2 of 3): …"). The label is at most MAX_LABEL_CHARS."""
    if not value:
        return []
    room = MAX_CONTENT_CHARS - len(label) - 20
    if room < 1:
        raise AgentFileError(f"A Letta memory block's label has {len(label):,} characters: too long.")
    chunks, current = [], ""
    for paragraph in value.split("\n\n"):
        while len(paragraph) > room:
            if current:
                chunks.append(current)
                current = ""
            chunks.append(paragraph[:room])
            paragraph = paragraph[room:]
        if current and len(current) + 2 + len(paragraph) > room:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    if current.strip():
        chunks.append(current)
    if len(chunks) == 1:
        return [f"{label}: {chunks[0].strip()}"]
    return [f"{label} ({i} of {len(chunks)}): {chunk.strip()}" for i, chunk in enumerate(chunks, 1)]


def _memory(number: int, content: str, protected: bool, now: str) -> dict[str, Any]:
    return {
        "ref": ref("memory", number),
        "memory_type": "core",
        "constitutional": protected,
        "content": content,
        "audience": "everyone",
        "chat": None,
        "created_at": now,
        "updated_at": now,
        "deleted_at": None,
    }


def _creation(number: int, memory: dict[str, Any]) -> dict[str, Any]:
    """The audit row that says where the memory came from (a Letta memory block)."""
    after = {
        key: memory[key] for key in ("content", "memory_type", "constitutional", "deleted_at", "audience")
    }
    return {
        "ref": ref("audit", number),
        "action": "memory_create",
        "target": memory["ref"],
        "who": None,
        "via": VIA,
        "session": None,
        "data": {"before": None, "after": after},
        "created_at": memory["created_at"],
    }
