"""The cairn-agent file format, version 2, as a JSON Schema (docs/cairn-agent.schema.json is this, printed by
`flask agents schema`), and the references a file uses instead of database ids."""

import re
from typing import Any

from webapp.models.agents import BACKGROUND_CHANGES, MEMORY_VISIBILITY, SYSTEM_PROMPT_MAX_CHARS
from webapp.models.chats import CHAT_SOURCES, CHAT_VISIBILITIES, MESSAGE_ROLES
from webapp.models.memories import AUDIENCES, MAX_CONTENT_CHARS, MEMORY_TYPES

FORMAT = "cairn-agent"
# 2: a reply's tool steps are objects, naming the memory or chat they link to by reference; a memory may name
# the messages it came from (sources)
VERSION = 2
READ_VERSIONS = (1, 2)  # a version-1 file is upgraded as it is read (webapp.agent_files.restore)
SCHEMA_ID = "https://cairn.local/schemas/cairn-agent-2.schema.json"

# A file names its rows by references that mean something only inside it ("m3": its third memory), never by a
# database id: an import gives every row a new id and maps these to them.
PREFIXES = {"memory": "m", "audit": "a", "chat": "c", "message": "msg"}
# Keys of an audit row's data that name a row, by what they name. Any other key ending in _id or _ids names
# something the format does not carry: export leaves it out, and import refuses a file that has one.
DATA_REFS = {
    "merged_into": "memory",
    "undo_of": "audit",
    "chat_id": "chat",
    "message_id": "message",
    "first_message_id": "message",
    "last_message_id": "message",
}
EXPORTED_STATUSES = ("done", "failed")  # an unfinished reply is exported as failed: nothing resumes it
STEP_STATES = ("running", "done", "failed")

# What one file may hold (docs/agent-file.md): the forms' limits on its fields, and caps on its rows. An import
# is one transaction (all of it or nothing), which holds the database's write lock on SQLite until it commits: the
# caps keep that short. These are the format's (and `flask agents import`'s, run by an operator); an upload on the
# agents page takes UPLOAD_CAPS, a few seconds of writing.
MAX_MEMORIES = 10_000
MAX_AUDIT_ROWS = 30_000
MAX_CHATS = 1_000
MAX_MESSAGES = 20_000  # in all its chats together
FILE_CAPS = {"memories": MAX_MEMORIES, "audit": MAX_AUDIT_ROWS, "chats": MAX_CHATS, "messages": MAX_MESSAGES}
UPLOAD_CAPS = {"memories": 2_000, "audit": 6_000, "chats": 200, "messages": 4_000}
MAX_TEXT_CHARS = 100_000  # a message, a summary, any other text without a limit of its own
MAX_MEMORY_DOC_CHARS = 1_000_000
MAX_DEPTH = 32  # levels of nested objects and lists; a cairn-agent file has 8 at most


def ref(kind: str, number: int) -> str:
    return f"{PREFIXES[kind]}{number}"


def ref_pattern(kind: str) -> str:
    return rf"^{PREFIXES[kind]}[1-9][0-9]*$"


def is_ref(kind: str, value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(ref_pattern(kind), value) is not None


def names_an_id(key: str) -> bool:
    """A data key that names a row by id (chat_id, api_key_id, memory_ids …)."""
    return key.endswith(("_id", "_ids")) or key in DATA_REFS


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _refs(kind: str) -> dict[str, Any]:
    return {"type": "array", "items": {"$ref": f"#/$defs/{kind}_ref"}}


_DATETIME = {"type": "string", "format": "date-time", "description": "ISO 8601, UTC."}
_TEXT = {"type": "string", "maxLength": MAX_TEXT_CHARS}
_PERSON = {
    "type": "object",
    "description": "A person, by name and e-mail: text, never an id.",
    "required": ["name", "email"],
    "additionalProperties": False,
    "properties": {"name": _TEXT, "email": _nullable(_TEXT)},
}

_AGENT = {
    "type": "object",
    "description": "The agent's settings. No secret: provider keys are the deployment's, never an agent's.",
    "required": [
        "name",
        "slug",
        "system_prompt",
        "model_id",
        "enabled_tools",
        "core_token_budget",
        "memory_token_budget",
        "members_see_memory",
        "consolidates_direct_chats",
        "paused",
        "last_refinement_at",
        "created_at",
        "updated_at",
    ],
    "additionalProperties": False,
    "properties": {
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": 80,
            "description": "Imported as this, or as a name given on import, when it is one the agent form takes: "
            "1 to 40 letters, digits, spaces, dots, dashes or apostrophes, starting with a letter or digit.",
        },
        "slug": {"type": "string", "maxLength": 60, "description": "Its id for API clients (/v1)."},
        "system_prompt": {"type": "string", "maxLength": SYSTEM_PROMPT_MAX_CHARS},
        "model_id": {"type": "string", "minLength": 1, "maxLength": 200},
        "enabled_tools": {"type": "array", "items": _TEXT, "uniqueItems": True},
        "core_token_budget": {"type": "integer", "minimum": 1},
        "memory_token_budget": _nullable({"type": "integer", "minimum": 1}),
        "members_see_memory": {"enum": list(MEMORY_VISIBILITY)},
        "consolidates_direct_chats": {"type": "boolean"},
        "paused": {"type": "boolean"},
        "background_changes": {
            "enum": list(BACKGROUND_CHANGES),
            "description": "Whether its refinement sessions' merges, rewrites and deletes apply at once or are "
            "staged for an admin's approval (absent: staged, as for any new agent).",
        },
        "last_refinement_at": _nullable(_DATETIME),
        "created_at": _DATETIME,
        "updated_at": _DATETIME,
    },
}

_MEMORY = {
    "type": "object",
    "required": [
        "ref",
        "memory_type",
        "constitutional",
        "content",
        "audience",
        "chat",
        "created_at",
        "updated_at",
        "deleted_at",
    ],
    "additionalProperties": False,
    "properties": {
        "ref": {"$ref": "#/$defs/memory_ref"},
        "memory_type": {"enum": list(MEMORY_TYPES)},
        "constitutional": {"type": "boolean"},
        "content": {"type": "string", "minLength": 1, "maxLength": MAX_CONTENT_CHARS},
        "audience": {
            "enum": list(AUDIENCES),
            "description": "chat: heard where the chat it came from may be read; everyone: by the account.",
        },
        "chat": _nullable({"$ref": "#/$defs/chat_ref"}),
        "created_at": {**_DATETIME, "description": "Journal entries fade from prompts 7 days after this."},
        "updated_at": _DATETIME,
        "deleted_at": _nullable(_DATETIME),
        "sources": {
            **_refs("message"),
            "description": "The messages it came from, those the file carries (none: no key).",
        },
    },
}

_AUDIT = {
    "type": "object",
    "required": ["ref", "action", "target", "who", "via", "session", "data", "created_at"],
    "additionalProperties": False,
    "properties": {
        "ref": {"$ref": "#/$defs/audit_ref"},
        "action": {"type": "string", "minLength": 1, "maxLength": 80},
        "target": {
            "description": '"agent" (a refinement session\'s rows), or the memory changed.',
            "anyOf": [{"const": "agent"}, {"$ref": "#/$defs/memory_ref"}],
        },
        "who": _nullable({**_PERSON, "description": "The person who acted; null: a job, as the agent."}),
        "via": _nullable(_TEXT),
        "session": _nullable({"type": "string", "minLength": 1, "maxLength": 36}),
        "data": {
            "type": "object",
            "description": "before/after snapshots and what the change recorded; ids are references of this "
            "file (merged_into: memory, undo_of: audit row, chat_id: chat, message_id, first_message_id, "
            "last_message_id: message, or null when that message is not in the file).",
            "properties": {
                "merged_into": {"$ref": "#/$defs/memory_ref"},
                "undo_of": {"$ref": "#/$defs/audit_ref"},
                "chat_id": _nullable({"$ref": "#/$defs/chat_ref"}),
                "message_id": _nullable({"$ref": "#/$defs/message_ref"}),
                "first_message_id": _nullable({"$ref": "#/$defs/message_ref"}),
                "last_message_id": _nullable({"$ref": "#/$defs/message_ref"}),
            },
        },
        "created_at": _DATETIME,
    },
}

_SESSION = {
    "type": "object",
    "description": "A refinement session, summed up from its audit rows (ignored on import: derived).",
    "required": ["session", "started_at", "closed_by", "changes"],
    "additionalProperties": False,
    "properties": {
        "session": _TEXT,
        "started_at": _nullable(_DATETIME),
        "closed_by": _nullable(_TEXT),
        "changes": {"type": "integer", "minimum": 0},
    },
}

_SOURCES = {
    "type": "object",
    "description": "What this agent's reply's prompt held (provenance).",
    "required": [
        "memories",
        "recalled_memories",
        "recalled_chats",
        "summary_chats",
        "borrowed_chat",
        "conversation_summary",
        "created_at",
    ],
    "additionalProperties": False,
    "properties": {
        "memories": _refs("memory"),
        "recalled_memories": _refs("memory"),
        "recalled_chats": _refs("chat"),
        "summary_chats": _refs("chat"),
        "borrowed_chat": _nullable({"$ref": "#/$defs/chat_ref"}),
        "conversation_summary": {"type": "boolean"},
        "created_at": _DATETIME,
    },
}

_STEP = {
    "anyOf": [
        {**_TEXT, "description": "A step as replies of older Cairns stored it: the tool's name."},
        {
            "type": "object",
            "description": "A tool call of the reply as the chat shows it (webapp.tools.steps): a step while it "
            "ran (label), then a chip saying what it did. It names another conversation only as the exporter "
            "may read it; the memory saved and the chat borrowed from are references of this file (null when "
            "the file does not hold them).",
            "required": ["tool", "state"],
            "additionalProperties": False,
            "properties": {
                "tool": {"type": "string", "minLength": 1, "maxLength": 80},
                "state": {"enum": list(STEP_STATES)},
                "label": _TEXT,
                "chip": _TEXT,
                "memory_type": {"enum": list(MEMORY_TYPES)},
                "memory": _nullable({"$ref": "#/$defs/memory_ref"}),
                "chat": _nullable({"$ref": "#/$defs/chat_ref"}),
                # A tool of a tool server (MCP): which, what the model asked it and what it answered (cut).
                "server": {"type": "string", "maxLength": 24},
                "server_tool": {"type": "string", "maxLength": 200},
                "arguments": {"type": "object"},
                "result": _TEXT,
            },
        },
    ]
}

_MESSAGE = {
    "type": "object",
    "required": [
        "ref",
        "role",
        "author",
        "content",
        "status",
        "error",
        "tools_used",
        "created_at",
        "sources",
    ],
    "additionalProperties": False,
    "properties": {
        "ref": {"$ref": "#/$defs/message_ref"},
        "role": {"enum": list(MESSAGE_ROLES)},
        "author": {
            "type": "object",
            "description": "self: this agent; agent: another agent (its name only); person; none.",
            "required": ["kind", "name", "email"],
            "additionalProperties": False,
            "properties": {
                "kind": {"enum": ["self", "agent", "person", "none"]},
                "name": _TEXT,
                "email": _nullable(_TEXT),
            },
        },
        "content": _TEXT,
        "status": {"enum": list(EXPORTED_STATUSES)},
        "error": _nullable(_TEXT),
        "tools_used": _nullable({"type": "array", "items": _STEP}),
        "created_at": _DATETIME,
        "sources": _nullable(_SOURCES),
    },
}

_CHAT = {
    "type": "object",
    "description": "A chat the file refers to. With included true it carries its messages; otherwise it is a "
    "reference only (title null when the exporting admin may not read it).",
    "required": [
        "ref",
        "included",
        "title",
        "visibility",
        "source",
        "group",
        "people",
        "started_by",
        "created_at",
        "last_message_at",
        "discarded_at",
    ],
    "additionalProperties": False,
    "properties": {
        "ref": {"$ref": "#/$defs/chat_ref"},
        "included": {"type": "boolean"},
        "title": _nullable({"type": "string", "maxLength": 200}),
        "visibility": {"enum": list(CHAT_VISIBILITIES)},
        "source": {"enum": list(CHAT_SOURCES)},
        "group": {"type": "boolean", "description": "A group chat: agents answer when asked."},
        "people": {"type": "array", "items": _PERSON},
        "started_by": _nullable(_PERSON),
        "created_at": _DATETIME,
        "last_message_at": _DATETIME,
        "discarded_at": _nullable(_DATETIME),
        "other_agents": {"type": "array", "items": _TEXT, "description": "Names only."},
        "joined_at": _DATETIME,
        "summary": _nullable(_TEXT),
        "summary_generated_at": _nullable(_DATETIME),
        "consolidated_through": _nullable({"$ref": "#/$defs/message_ref"}),
        "last_consolidated_at": _nullable(_DATETIME),
        "memory_doc": {"type": "string", "maxLength": MAX_MEMORY_DOC_CHARS},
        "compacted_through": _nullable({"$ref": "#/$defs/message_ref"}),
        "messages": {"type": "array", "items": _MESSAGE, "maxItems": MAX_MESSAGES},
    },
    "if": {"properties": {"included": {"const": True}}},
    "then": {
        "required": [
            "other_agents",
            "joined_at",
            "summary",
            "summary_generated_at",
            "consolidated_through",
            "last_consolidated_at",
            "memory_doc",
            "compacted_through",
            "messages",
        ]
    },
    "else": {"not": {"required": ["messages"]}},
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "A Cairn agent: its settings, memories, audit trail and (optionally) chats",
    "type": "object",
    "required": [
        "format",
        "version",
        "exported_at",
        "with_chats",
        "agent",
        "memories",
        "audit",
        "sessions",
        "chats",
    ],
    "additionalProperties": False,
    "properties": {
        "format": {"const": FORMAT},
        "version": {"enum": list(READ_VERSIONS)},
        "exported_at": _DATETIME,
        "exported_by": _nullable(_PERSON),
        "with_chats": {"type": "boolean"},
        "agent": _AGENT,
        "memories": {"type": "array", "items": _MEMORY, "maxItems": MAX_MEMORIES},
        "audit": {"type": "array", "items": _AUDIT, "maxItems": MAX_AUDIT_ROWS},
        "sessions": {"type": "array", "items": _SESSION, "maxItems": MAX_AUDIT_ROWS},
        "chats": {
            "type": "array",
            "items": _CHAT,
            "maxItems": MAX_CHATS,
            "description": f"At most {MAX_MESSAGES:,} messages in all of them together.",
        },
    },
    "$defs": {f"{kind}_ref": {"type": "string", "pattern": ref_pattern(kind)} for kind in PREFIXES},
}
