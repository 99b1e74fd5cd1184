"""A cairn-agent file restored into an account as a new agent, in one transaction: all of it, or (refused with
an AgentFileError saying why) nothing.

Nothing in a file is trusted as a database id: its rows name each other by references (m1, a1, c1, msg1) that
are mapped to the new rows. Derived values are computed again: a memory's content_hash and token_estimate by
its validator, full-text indexes by the database's triggers, vectors by the embedding queue (every memory and
finished message added through the session is queued by webapp.jobs.embeddings' after_flush hook).

Chats (docs/agent-file.md): a chat the file carries is restored with its messages; a chat it only refers to
(a memory's, an audit row's, a reply's or a tool step's) becomes an empty, discarded "archive" chat with the same
title. Every chat an import makes is the importer's: started by them, private to them, in no one else's list,
so a memory of a chat is never heard by more people than before. A message is never put in the mouth of
someone of the account: the file's people (and other agents) who wrote messages are kept as text, with the names
the file gives them.
"""

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match
from slugify import slugify

from webapp.agent_files import letta
from webapp.agent_files.errors import AgentFileError, NameRefused, NameTaken
from webapp.agent_files.export import CHAT_IMPORT
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
from webapp.models import (
    Account,
    Agent,
    AgentMemory,
    AuditLog,
    Chat,
    ChatAgent,
    ChatPerson,
    MemorySource,
    Message,
    ReplySources,
    User,
)
from webapp.models.agents import NAME_MAX_CHARS, NAME_PATTERN, NAME_RULE
from webapp.models.memories import ConstitutionalMemoryError
from webapp.timeutil import utcnow
from webapp.tools import REPLY_TOOLS
from webapp.tools.steps import may_name_a_chat, unnamed

AGENT_IMPORT = "agent_import"
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


@dataclass
class Imported:
    """What an import made."""

    agent: Agent
    memories: int = 0
    audit_rows: int = 0
    chats: int = 0
    archived_chats: int = 0
    dropped_tools: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [
            f"{self.memories} memories",
            f"{self.audit_rows} audit rows",
            f"{self.chats} chats with their messages",
            f"{self.archived_chats} archived chat references",
        ]
        text = f"Imported {self.agent.name}: {', '.join(parts)}."
        if self.dropped_tools:
            text += f" Tools this Cairn does not have were left off: {', '.join(self.dropped_tools)}."
        return text


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
    return _short(error.message)


def _path(parts) -> str:
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)
    return text.lstrip(".") or "its top level"


def _short(text: str, limit: int = 300) -> str:
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


def import_agent(
    document: dict[str, Any], account: Account, *, name: str | None = None, by: User | None = None, via: str
) -> Imported:
    """Restore a checked document (read()) into the account as a new agent named `name` (default: the
    file's), acting as `by` (an admin of the account; None: the command line) and recorded as `via`. One
    transaction: committed whole, or rolled back and refused with an AgentFileError."""
    try:
        imported = _Restore(document, account, by, via).run(name)
        db.session.commit()
    except AgentFileError:
        db.session.rollback()
        raise
    except (ValueError, sa.exc.IntegrityError, sa.exc.DataError) as error:
        db.session.rollback()
        raise AgentFileError(
            f"The file could not be imported: {_short(str(error).splitlines()[0])}"
        ) from None
    return imported


class _Restore:
    """One import: the maps from the file's references to the new rows, and the steps that fill them."""

    def __init__(self, document: dict[str, Any], account: Account, by: User | None, via: str) -> None:
        self.document, self.account, self.by, self.via = document, account, by, via
        self.chats: dict[str, Chat] = {}
        self.messages: dict[str, Message] = {}
        self.memories: dict[str, AgentMemory] = {}
        self.rows: dict[str, AuditLog] = {}
        self.sessions: dict[str, str] = {}
        self.archived: set[str] = set()  # the chats made as archives of chats the file only refers to
        self.authors: dict[str, dict[str, dict[str, Any]]] = {}  # by chat: what no one of the account wrote
        self.people = self._people_of_account()

    def run(self, name: str | None) -> Imported:
        settings = self.document["agent"]
        self.agent = self._agent(settings, name)
        imported = Imported(
            self.agent, dropped_tools=[t for t in settings["enabled_tools"] if t not in REPLY_TOOLS]
        )
        for entry in self.document["chats"]:
            self._chat(entry)
        db.session.flush()
        self._links()
        for entry in self.document["memories"]:
            self._memory(entry)
        db.session.flush()
        self._memory_sources()
        self._sources()
        self._steps()
        for entry in self.document["audit"]:
            self._audit_row(entry)
        db.session.flush()
        self._link_undos()
        self._record_chats()
        imported.memories, imported.audit_rows = len(self.memories), len(self.rows)
        imported.archived_chats = len(self.archived)
        imported.chats = len(self.chats) - imported.archived_chats
        self._record_import(imported)
        return imported

    def _record_import(self, imported: Imported) -> None:
        """The agent's audit row saying it was imported, by whom, from what and how much."""
        AuditLog.record(
            AGENT_IMPORT,
            self.agent,
            account_id=self.account.id,
            agent_id=self.agent.id,
            user_id=self.by.id if self.by else None,
            via=self.via,
            format_version=self.document["version"],
            exported_at=self.document["exported_at"],
            name_in_file=self.document["agent"]["name"],
            memories=imported.memories,
            audit_rows=imported.audit_rows,
            chats=imported.chats,
            archived_chats=imported.archived_chats,
        )
        db.session.flush()

    def _people_of_account(self) -> dict[str, User]:
        """The account's people, by e-mail, whom the file's audit rows name."""
        emails = {(row["who"] or {}).get("email") for row in self.document["audit"]}
        emails = {email.strip().lower() for email in emails if email}
        if not emails:
            return {}
        users = db.session.scalars(
            sa.select(User).where(User.account_id == self.account.id, User.email.in_(emails))
        )
        return {user.email: user for user in users}

    def _person(self, entry: dict[str, Any] | None) -> User | None:
        email = (entry or {}).get("email")
        return self.people.get(email.strip().lower()) if email else None

    def _agent(self, settings: dict[str, Any], name: str | None) -> Agent:
        name = (name if name is not None else settings["name"]).strip()
        if not 1 <= len(name) <= NAME_MAX_CHARS or not re.match(NAME_PATTERN, name):
            raise NameRefused(
                f"The agent's name {_short(name, 60)!r} is not one the agent form takes: 1 to {NAME_MAX_CHARS} "
                f"characters. {NAME_RULE}"
            )
        taken = db.session.scalar(
            sa.select(Agent.id).where(
                Agent.account_id == self.account.id, sa.func.lower(Agent.name) == name.lower()
            )
        )
        if taken:
            raise NameTaken(f"An agent named {name!r} is in account {self.account.name!r} already.")
        agent = Agent(
            account_id=self.account.id,
            name=name,
            slug=self._slug(settings["slug"], renamed=name != settings["name"]),
            system_prompt=settings["system_prompt"],
            model_id=settings["model_id"],
            enabled_tools=[tool for tool in settings["enabled_tools"] if tool in REPLY_TOOLS],
            core_token_budget=settings["core_token_budget"],
            memory_token_budget=settings["memory_token_budget"],
            members_see_memory=settings["members_see_memory"],
            consolidates_direct_chats=settings["consolidates_direct_chats"],
            paused=settings["paused"],
            background_changes=settings.get("background_changes", "staged"),
            last_refinement_at=time(settings["last_refinement_at"]),
            created_at=time(settings["created_at"]),
            updated_at=time(settings["updated_at"]),
        )
        db.session.add(agent)
        db.session.flush()
        return agent

    def _slug(self, slug: str, *, renamed: bool) -> str | None:
        """The file's slug when it is a slug, the agent keeps its name and no agent of the account has it; else
        None, for one made from the name."""
        if renamed or not slug or slugify(slug) != slug:
            return None
        taken = db.session.scalar(
            sa.select(Agent.id).where(Agent.account_id == self.account.id, Agent.slug == slug)
        )
        return None if taken else slug

    def _chat(self, entry: dict[str, Any]) -> None:
        """A chat of the file, the importer's alone: with its messages, or an empty discarded archive chat
        standing for it. The file's people and visibility are not taken: the importer shares it if they will."""
        included = entry["included"]
        chat = Chat(
            account_id=self.account.id,
            title=entry["title"] or "",
            visibility="private",
            source=entry["source"],
            manual_responses=entry["group"],
            started_by_id=self.by.id if self.by else None,
            created_at=time(entry["created_at"]),
            last_message_at=time(entry["last_message_at"]),
            discarded_at=time(entry["discarded_at"]) if included else utcnow(),
            memory_doc=entry.get("memory_doc", ""),
            last_consolidated_at=time(entry.get("last_consolidated_at")),
            chat_people=[ChatPerson(user_id=self.by.id, added_by_id=self.by.id)] if self.by else [],
        )
        db.session.add(chat)
        self.chats[entry["ref"]] = chat
        self.authors[entry["ref"]] = {}
        if not included:
            self.archived.add(entry["ref"])
        for message in entry.get("messages", []):
            self._message(chat, entry["ref"], message)

    def _links(self) -> None:
        """The agent in each chat the file carries, with its summary and how far it turned the chat into
        memories (so consolidation does not read again what the memories came from), and the chat's compaction."""
        for entry in self.document["chats"]:
            if not entry["included"]:
                continue
            chat = self.chats[entry["ref"]]
            consolidated = self._message_id(entry["consolidated_through"])
            db.session.add(
                ChatAgent(
                    chat=chat,
                    agent=self.agent,
                    agent_summary=entry["summary"],
                    agent_summary_generated_at=time(entry["summary_generated_at"]),
                    last_consolidated_message_id=consolidated,
                    created_at=time(entry["joined_at"]),
                )
            )
            chat.last_consolidated_message_id = consolidated
            chat.compacted_through_message_id = self._message_id(entry["compacted_through"])

    def _message_id(self, ref: str | None) -> int | None:
        return self.messages[ref].id if ref is not None else None

    def _message(self, chat: Chat, chat_ref: str, entry: dict[str, Any]) -> None:
        """A message of the file: the agent's own, or by someone kept as text (never a person of the account,
        whatever e-mail the file gives: an import does not speak for anyone)."""
        author = entry["author"]
        message = Message(
            chat=chat,
            role=entry["role"],
            content=entry["content"],
            agent_id=self.agent.id if author["kind"] == "self" else None,
            status=entry["status"],
            error=entry["error"],
            created_at=time(entry["created_at"]),
            updated_at=time(entry["created_at"]),
        )
        db.session.add(message)
        self.messages[entry["ref"]] = message
        if author["kind"] in ("person", "agent"):
            self.authors[chat_ref][entry["ref"]] = author  # kept as text: no one of this account wrote it

    def _memory(self, entry: dict[str, Any]) -> None:
        chat = self.chats.get(entry["chat"])
        try:
            memory = AgentMemory(
                agent_id=self.agent.id,
                constitutional=entry[
                    "constitutional"
                ],  # before deleted_at, which the model checks against it
                content=entry["content"],
                memory_type=entry["memory_type"],
                audience=entry["audience"],
                chat_id=chat.id if chat else None,
                created_at=time(entry["created_at"]),
                updated_at=time(entry["updated_at"]),
                deleted_at=time(entry["deleted_at"]),
            )
        except ConstitutionalMemoryError:
            raise AgentFileError(
                f"Memory {entry['ref']} is constitutional and deleted: Cairn never deletes one."
            ) from None
        except ValueError as error:
            raise AgentFileError(f"Memory {entry['ref']}: {error}") from None
        db.session.add(memory)
        self.memories[entry["ref"]] = memory

    def _memory_sources(self) -> None:
        """The messages each memory came from, by their new ids."""
        rows = [
            {"memory_id": self.memories[entry["ref"]].id, "message_id": self.messages[ref].id}
            for entry in self.document["memories"]
            for ref in dict.fromkeys(entry.get("sources", []))
        ]
        if rows:
            db.session.execute(sa.insert(MemorySource), rows)

    def _sources(self) -> None:
        """The provenance of the agent's replies, with the new ids of the memories and chats they name."""
        for chat in self.document["chats"]:
            for entry in chat.get("messages", []):
                if (sources := entry["sources"]) is None or self.messages[
                    entry["ref"]
                ].agent_id != self.agent.id:
                    continue
                borrowed = self.chats.get(sources["borrowed_chat"])
                db.session.add(
                    ReplySources(
                        message_id=self.messages[entry["ref"]].id,
                        memory_ids=[self.memories[r].id for r in sources["memories"]],
                        recalled_memory_ids=[self.memories[r].id for r in sources["recalled_memories"]],
                        recalled_chat_ids=[self.chats[r].id for r in sources["recalled_chats"]],
                        summary_chat_ids=[self.chats[r].id for r in sources["summary_chats"]],
                        borrowed_chat_id=borrowed.id if borrowed else None,
                        conversation_summary=sources["conversation_summary"],
                        created_at=time(sources["created_at"]),
                    )
                )

    def _steps(self) -> None:
        """Each reply's tool steps, linked to the new memory or chat they name."""
        for chat in self.document["chats"]:
            for entry in chat.get("messages", []):
                if entry["tools_used"] is not None:
                    steps = [self._step(step) for step in entry["tools_used"]]
                    self.messages[entry["ref"]].tools_used = steps

    def _step(self, step: Any) -> Any:
        if not isinstance(step, dict):
            return step
        stored = {key: value for key, value in step.items() if key not in ("memory", "chat")}
        if "memory" in step:
            stored["memory_id"] = self.memories[step["memory"]].id if step["memory"] else None
        if "chat" in step:
            stored["chat_id"] = self.chats[step["chat"]].id if step["chat"] else None
        return stored

    def _audit_row(self, entry: dict[str, Any]) -> None:
        user = self._person(entry["who"])
        data = {key: self._new_id(key, value) for key, value in entry["data"].items() if key != "undo_of"}
        if entry["via"] is not None:
            data["via"] = entry["via"]
        if entry["who"] is not None and user is None:
            data["who"] = entry["who"]  # someone of another account: kept as text (the audit log shows it)
        target = self.agent if entry["target"] == "agent" else self.memories[entry["target"]]
        row = AuditLog(
            account_id=self.account.id,
            user_id=user.id if user else None,
            agent_id=self.agent.id,
            action=entry["action"],
            auditable_type=type(target).__name__,
            auditable_id=target.id,
            session_id=self._session(entry["session"]),
            data=data,
            created_at=time(entry["created_at"]),
        )
        db.session.add(row)
        self.rows[entry["ref"]] = row

    def _new_id(self, key: str, value: Any) -> Any:
        kind = DATA_REFS.get(key)
        if kind is None or value is None:
            return value
        return {"memory": self.memories, "chat": self.chats, "message": self.messages}[kind][value].id

    def _session(self, session: str | None) -> str | None:
        """A new id for each session of the file: ids are global, and rolling back a session goes by it."""
        return None if session is None else self.sessions.setdefault(session, str(uuid.uuid4()))

    def _link_undos(self) -> None:
        """An undo row names the row it undid, which has its id only now."""
        for entry in self.document["audit"]:
            if (undone := entry["data"].get("undo_of")) is not None:
                row = self.rows[entry["ref"]]
                row.data = {**row.data, "undo_of": self.rows[undone].id}

    def _record_chats(self) -> None:
        """One audit row on each chat made: where it came from, and what it keeps as text (who wrote what no
        one here wrote, the other agents it had)."""
        entries = {entry["ref"]: entry for entry in self.document["chats"]}
        for ref, chat in self.chats.items():
            AuditLog.record(
                CHAT_IMPORT,
                chat,
                account_id=self.account.id,
                user_id=self.by.id if self.by else None,
                via=self.via,
                agent=self.agent.name,
                archive=ref in self.archived,
                other_agents=entries[ref].get("other_agents", []),
                authors={str(self.messages[m].id): author for m, author in self.authors[ref].items()},
            )
