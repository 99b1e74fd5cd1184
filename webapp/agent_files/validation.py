"""A cairn-agent file read and checked before anything is imported: complete JSON, a format and version this
Cairn reads, within its caps, following the schema (docs/agent-file.md), naming no database id, every reference
naming a row of the file. A Letta .af file is read as the agent it describes (letta.py)."""

import json
import re
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from webapp.agent_files import letta
from webapp.agent_files.errors import AgentFileError, NameRefused, NameTaken
from webapp.agent_files.schema import (
    DATA_REFS,
    FILE_CAPS,
    FORMAT,
    MAX_DEPTH,
    SCHEMA,
    VERSION,
    is_ref,
    names_an_id,
)
from webapp.extensions import db
from webapp.models import Account, Agent
from webapp.models.agents import NAME_MAX_CHARS, NAME_PATTERN, NAME_RULE
from webapp.tools.steps import may_name_a_chat, unnamed

# Where a file names another row: these keys hold references (or lists of them), never database ids.
REF_KEYS = {
    "ref",
    "chat",
    "memory",
    "target",
    "borrowed_chat",
    "consolidated_through",
    "compacted_through",
    "recalled_memories",
    "recalled_chats",
    "summary_chats",
}


_VALIDATOR = Draft202012Validator(SCHEMA)


def read(raw: bytes | str, caps: dict[str, int] = FILE_CAPS) -> dict[str, Any]:
    """The document in a file, checked: complete JSON nested at most MAX_DEPTH levels, a format and version this
    Cairn reads, at most `caps` rows of each kind, following the schema, every reference naming a row of the
    file. A Letta .af file is read as the agent it describes."""
    try:
        text = raw.decode("utf-8-sig") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise AgentFileError(f"The file is not an agent file: it is not text. {_WHAT_IT_IS}") from None
    try:
        document = json.loads(text)
        if isinstance(document, str):  # Letta's export saved as a JSON string of JSON
            document = json.loads(document)
    except json.JSONDecodeError as error:
        raise AgentFileError(_not_json(text, error)) from None
    except RecursionError:
        raise AgentFileError(_TOO_DEEP) from None
    _check_depth(document)
    if not isinstance(document, dict) or (
        document.get("format") != FORMAT and not letta.is_agent_file(document)
    ):
        raise AgentFileError(f"The file is not an agent file: it is JSON, but not an agent's. {_WHAT_IT_IS}")
    if document.get("format") != FORMAT:
        return check(letta.to_cairn(document), caps)
    return check(document, caps)


_WHAT_IT_IS = (
    "An agent file is what an agent's Download button saves (a .cairn.json file, whose JSON says "
    f'"format": "{FORMAT}"), or a Letta agent file (.af).'
)


def _not_json(text: str, error: json.JSONDecodeError) -> str:
    """Why text is not JSON: JSON cut short (its error at the very end), JSON broken inside, or no JSON at all."""
    if not text.lstrip().startswith(("{", "[", '"')):
        return f"The file is not an agent file: it is not JSON. {_WHAT_IT_IS}"
    where = f"{error.msg} at line {error.lineno}, column {error.colno}."
    if error.pos >= len(text.rstrip()) or error.msg.startswith("Unterminated string"):  # it runs to the end
        return f"The file is not complete JSON (was it cut short?): {where}"
    return f"The file is not valid JSON: {where}"


_TOO_DEEP = f"The file's JSON nests deeper than {MAX_DEPTH} levels; an agent file never does."


def _check_depth(document: Any) -> None:
    """Refuse JSON nested deeper than MAX_DEPTH (walked without recursion), before anything recurses into it."""
    level = [document]
    for _ in range(MAX_DEPTH):
        level = [
            item
            for value in level
            if isinstance(value, dict | list)
            for item in (value.values() if isinstance(value, dict) else value)
            if isinstance(item, dict | list)
        ]
        if not level:
            return
    raise AgentFileError(_TOO_DEEP)


def _check_counts(document: dict[str, Any], caps: dict[str, int]) -> None:
    """Refuse a file with more rows than this import takes (docs/agent-file.md), before checking each row."""
    counts = {key: len(document[key]) for key in caps if isinstance(document.get(key), list)}
    chats = [chat for chat in document.get("chats") or [] if isinstance(chat, dict)]
    counts["messages"] = sum(len(c["messages"]) for c in chats if isinstance(c.get("messages"), list))
    for key, count in counts.items():
        if count > caps[key]:
            more = " (`flask agents import` takes more)" if caps[key] < FILE_CAPS[key] else ""
            raise AgentFileError(
                f"The file holds {count:,} {key.replace('audit', 'audit rows')}; an import here takes at most "
                f"{caps[key]:,}{more}."
            )


def check(document: dict[str, Any], caps: dict[str, int] = FILE_CAPS) -> dict[str, Any]:
    """The cairn-agent document, if this Cairn can import it; else AgentFileError."""
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise AgentFileError('The file has no valid "version" (a whole number from 1).')
    if version > VERSION:
        raise AgentFileError(
            f"The file is in cairn-agent format version {version}, newer than this Cairn reads (version "
            f"{VERSION}): upgrade Cairn to import it."
        )
    _check_counts(document, caps)
    if version == 1:
        _steps_without_ids(document)
    _no_database_ids(document, "file")
    error = best_match(_VALIDATOR.iter_errors(document))
    if error is not None:
        where = _path(error.absolute_path)
        raise AgentFileError(f"The file does not follow the cairn-agent format at {where}: {_problem(error)}")
    _check_references(document)
    return document


def _steps_without_ids(document: dict[str, Any]) -> None:
    """Read a version-1 file's tool steps as version 2 has them: version 1 wrote the ids of the memory a step
    saved and the chat it borrowed from, which mean nothing here, and named that chat as its exporter's database
    allowed. The step keeps its words without the link, and without the chat's title."""
    for chat in document.get("chats") or []:
        for message in chat.get("messages") or [] if isinstance(chat, dict) else []:
            steps = message.get("tools_used") if isinstance(message, dict) else None
            if isinstance(steps, list):
                message["tools_used"] = [_step_without_ids(step) for step in steps]


def _step_without_ids(step: Any) -> Any:
    if not isinstance(step, dict):
        return step
    if may_name_a_chat(step):
        step = unnamed(step)
    entry = {key: value for key, value in step.items() if key not in ("memory_id", "chat_id")}
    entry.update({key.removesuffix("_id"): None for key in ("memory_id", "chat_id") if key in step})
    return entry


def _problem(error) -> str:
    """What is wrong, without quoting a text or list that is too long in full."""
    if error.validator == "maxLength":
        return f"{len(error.instance):,} characters, more than the {error.validator_value:,} it may have."
    if error.validator == "maxItems":
        return f"{len(error.instance):,} items, more than the {error.validator_value:,} it may have."
    return short(error.message)


def _path(parts) -> str:
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)
    return text.lstrip(".") or "its top level"


def short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _no_database_ids(value: Any, where: str) -> None:
    """Refuse a number where a file may only name rows by its own references: an id of some database."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            _no_database_ids(item, f"{where}[{index}]")
        return
    if not isinstance(value, dict):
        return
    for key, item in value.items():
        numbers = item if isinstance(item, list) else [item]
        if (key in REF_KEYS or names_an_id(key)) and any(
            isinstance(n, int) and not isinstance(n, bool) for n in numbers
        ):
            raise AgentFileError(
                f"The file names a database id at {where}.{key} ({item!r}). A file names rows only by its own "
                "references (m1, a1, c1, msg1): ids of another account or another Cairn are never trusted."
            )
        if key not in ("before", "after"):
            _no_database_ids(item, f"{where}.{key}")


def _check_references(document: dict[str, Any]) -> None:
    """Every reference names a row of the file, each row has one reference, and nothing is contradictory."""
    memories = _unique(document["memories"], "memory")
    audit = _unique(document["audit"], "audit row")
    chats = _unique(document["chats"], "chat")
    messages = _unique([m for chat in chats.values() for m in chat.get("messages", [])], "message")
    pools = {"memory": memories, "audit": audit, "chat": chats, "message": messages}
    for ref, memory in memories.items():
        _check_memory(ref, memory, chats)
        for message_ref in memory.get("sources", []):
            _known(message_ref, messages, f"memory {ref}'s sources", "message")
    for ref, row in audit.items():
        _check_audit_row(ref, row, pools)
    for ref, chat in chats.items():
        _check_chat(ref, chat, pools)


def _check_memory(ref: str, memory: dict[str, Any], chats: dict[str, Any]) -> None:
    _known(memory["chat"], chats, f"memory {ref}", "chat")
    if memory["audience"] == "chat" and memory["chat"] is None:
        raise AgentFileError(f"Memory {ref} is heard in the chat it came from, but names no chat.")
    if memory["constitutional"] and memory["deleted_at"]:
        raise AgentFileError(f"Memory {ref} is constitutional and deleted: Cairn never deletes one.")


def _check_audit_row(ref: str, row: dict[str, Any], pools: dict[str, dict[str, Any]]) -> None:
    if row["target"] != "agent":
        _known(row["target"], pools["memory"], f"audit row {ref}", "memory")
    for key, value in row["data"].items():
        kind = DATA_REFS.get(key)
        if kind is None:
            if names_an_id(key):
                raise AgentFileError(f"Audit row {ref} names {key}, a row this format does not carry.")
            continue
        required = kind in ("memory", "audit")  # what a merge or an undo names is always in the file
        if (value is None and required) or (value is not None and not is_ref(kind, value)):
            raise AgentFileError(f"Audit row {ref} has {key} = {value!r}, not a reference to a {kind}.")
        _known(value, pools[kind], f"audit row {ref}", kind)


def _check_chat(ref: str, chat: dict[str, Any], pools: dict[str, dict[str, Any]]) -> None:
    own = {m["ref"]: m for m in chat.get("messages", [])}
    _known(chat.get("consolidated_through"), own, f"chat {ref}", "message of its own")
    _known(chat.get("compacted_through"), own, f"chat {ref}", "message of its own")
    for message in own.values():
        sources = message["sources"] or {}
        where = f"message {message['ref']}"
        for memory_ref in sources.get("memories", []) + sources.get("recalled_memories", []):
            _known(memory_ref, pools["memory"], where, "memory")
        chats = [*sources.get("recalled_chats", []), *sources.get("summary_chats", [])]
        for chat_ref in [*chats, sources.get("borrowed_chat")]:
            _known(chat_ref, pools["chat"], where, "chat")
        for step in message["tools_used"] or []:
            if isinstance(step, dict):
                _known(step.get("memory"), pools["memory"], f"{where}'s tool step", "memory")
                _known(step.get("chat"), pools["chat"], f"{where}'s tool step", "chat")


def _unique(rows: list[dict[str, Any]], what: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["ref"] in found:
            raise AgentFileError(f"Two of the file's rows are {what} {row['ref']}.")
        found[row["ref"]] = row
    return found


def _known(ref: str | None, pool: dict[str, Any], where: str, kind: str) -> None:
    if ref is not None and ref not in pool:
        raise AgentFileError(f"The file's {where} names {kind} {ref}, which the file does not hold.")


def time(value: str | None) -> datetime | None:
    """A file's ISO 8601 time as Cairn stores it (naive UTC)."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise AgentFileError(f"{value!r} in the file is not a date and time (ISO 8601).") from None
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def free_name(name: str, account: Account) -> str:
    """The name an imported agent takes (stripped), if the agent form would take it and no agent of the account
    has it (in any case); else NameRefused or NameTaken, saying why."""
    name = name.strip()
    if not 1 <= len(name) <= NAME_MAX_CHARS or not re.match(NAME_PATTERN, name):
        raise NameRefused(
            f"The agent's name {short(name, 60)!r} is not one the agent form takes: 1 to {NAME_MAX_CHARS} "
            f"characters. {NAME_RULE}"
        )
    taken = db.session.scalar(
        sa.select(Agent.id).where(Agent.account_id == account.id, sa.func.lower(Agent.name) == name.lower())
    )
    if taken:
        raise NameTaken(f"An agent named {name!r} is in account {account.name!r} already.")
    return name
