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

import uuid
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from slugify import slugify

from webapp.agent_files.errors import AgentFileError
from webapp.agent_files.export_chats import CHAT_IMPORT
from webapp.agent_files.schema import DATA_REFS
from webapp.agent_files.validation import free_name, short, time
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
from webapp.models.memories import ConstitutionalMemoryError
from webapp.timeutil import utcnow
from webapp.tools import REPLY_TOOLS

AGENT_IMPORT = "agent_import"


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
        raise AgentFileError(f"The file could not be imported: {short(str(error).splitlines()[0])}") from None
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
        name = free_name(name if name is not None else settings["name"], self.account)
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
