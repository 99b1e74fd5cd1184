"""Audit rows as the audit log and the session pages show them: who acted, what changed, as a word diff."""

import difflib
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import sqlalchemy as sa
from flask_login import current_user

from webapp.extensions import db
from webapp.models import Agent, AuditLog, User
from webapp.models.audit import FORGOTTEN_VIA, FORGOTTEN_WHERE

LABELS = {
    "memory_create": "created",
    "memory_update": "edited",
    "memory_delete": "deleted",
    "memory_restore": "restored",
    "memory_constitutional_toggle": "constitutional flag toggled",
    "memory_audience": "audience changed",
    "memory_promote": "promoted to core",
    "memory_dedup": "removed as a duplicate",
    "memory_undo": "undo",
    "memory_rollback": "rolled back",
    "memory_refinement_consolidate": "merged away by refinement",
    "memory_refinement_consolidate_create": "created by a refinement merge",
    "memory_refinement_update": "rewritten by refinement",
    "memory_refinement_delete": "deleted by refinement",
    "memory_refinement_protect": "protected by refinement",
    "memory_refinement_start": "refinement started",
    "memory_refinement_complete": "refinement complete",
    "memory_refinement_incomplete": "refinement incomplete",
    "memory_refinement_interrupted": "refinement interrupted",
    "memory_refinement_rolled_back": "refinement rolled back",
    "agent_export": "agent downloaded as a file",
    "agent_import": "agent imported from a file",
    "chat_import": "chat imported with an agent",
    "memory_proposal_decided": "proposal decided",
    "memory_proposal_expired": "proposal expired",
}
UNDOING = ("memory_undo", "memory_rollback")
# What a change of a memory's audience means, by the audience it got.
AUDIENCE_CHANGES = {
    "everyone": "Widened: heard by everyone",
    "chat": "Narrowed: heard only where the chat it came from may be read",
}
# What a change of each flag means, in words: (field, when it was set, when it was cleared).
FLAGS = (
    ("constitutional", "Protected as constitutional", "No longer constitutional"),
    ("deleted_at", "Deleted", "Restored"),
)


def entry_query() -> sa.Select:
    """Audit rows of the account with the acting user's email and the agent's name (one query)."""
    return (
        sa.select(AuditLog, User.email, Agent.name)
        .outerjoin(User, User.id == AuditLog.user_id)
        .outerjoin(Agent, Agent.id == AuditLog.agent_id)
        .where(AuditLog.account_id == current_user.account_id)
    )


def word_diff(before: str, after: str) -> list[tuple[str, str]]:
    """(op, text) segments from before to after, word by word: op is "same", "del" or "ins". A space shared
    between two changes joins them, so a rewritten phrase reads as one deletion and one insertion."""
    old, new = re.findall(r"\s+|\S+", before), re.findall(r"\s+|\S+", after)
    segments: list[tuple[str, str]] = []
    removed = added = space = ""

    def flush() -> None:
        nonlocal removed, added
        segments.extend((op, text) for op, text in (("del", removed), ("ins", added)) if text.strip())
        removed = added = ""

    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        same = "".join(old[i1:i2]) if tag == "equal" else ""
        if tag == "equal" and same.isspace() and (removed or added):
            space += same  # kept aside: it joins the next change, or stays plain text
            continue
        if tag == "equal":
            flush()
            segments.append(("same", space + same))
        else:
            removed, added = removed + space + "".join(old[i1:i2]), added + space + "".join(new[j1:j2])
        space = ""
    flush()
    if space:
        segments.append(("same", space))
    return segments


@dataclass
class Entry:
    row: AuditLog
    email: str | None
    agent_name: str | None
    undone_by: int | None = None
    error: str | None = None
    done: str | None = None

    @property
    def label(self) -> str:
        if self.row.action == "memory_delete" and self.via == FORGOTTEN_VIA:
            return "forgotten on its chat's memory page"
        if self.row.action == "memory_delete" and self.via in FORGOTTEN_WHERE:
            return f"forgotten {FORGOTTEN_WHERE[self.via]}"
        return LABELS.get(self.row.action, self.row.action.replace("_", " "))

    @property
    def via(self) -> str:
        default = "refinement" if self.row.action.startswith("memory_refinement") else "job"
        return self.row.data.get("via") or default

    @property
    def who(self) -> str:
        """The person's email, or the agent and the job it acted in: "Ada (refinement)"; for a change imported
        from an agent file, made by someone who is not of this account, their e-mail as the file gave it."""
        if self.email:
            return self.email
        if imported := (self.row.data or {}).get("who"):
            return f"{imported.get('email') or imported.get('name')} (imported)"
        if self.via == "cli" and (self.row.data or {}).get("proposal_id"):
            return "the command line"  # a proposal decided with no --by
        return f"{self.agent_name or 'an agent'} ({self.via})"

    @property
    def is_memory_change(self) -> bool:
        return self.row.auditable_type == "AgentMemory"

    @property
    def before(self) -> dict[str, Any] | None:
        return self.row.data.get("before")

    @property
    def after(self) -> dict[str, Any] | None:
        return self.row.data.get("after")

    @cached_property
    def diff(self) -> list[tuple[str, str]] | None:
        """The content's word diff; None when the content did not change, or this is not a memory change (a chat's
        summary is read on its chat's page, by those who may read the chat, never here)."""
        if not (self.is_memory_change and self.after):
            return None
        old = (self.before or {}).get("content", "")
        if self.before and old == self.after["content"]:
            return None
        return word_diff(old, self.after["content"])

    @property
    def flag_changes(self) -> list[str]:
        """What happened to the memory's type, constitutional flag and deletion, in words ("Restored")."""
        if not (self.before and self.after):
            return []
        before, after = self.before, self.after
        changes = []
        if before.get("memory_type") != after.get("memory_type"):
            changes.append(f"Moved from {before.get('memory_type')} to {after.get('memory_type')}")
        for key, on, off in FLAGS:
            if bool(before.get(key)) != bool(after.get(key)):
                changes.append(on if after.get(key) else off)
        if "audience" in before and "audience" in after and before["audience"] != after["audience"]:
            changes.append(AUDIENCE_CHANGES[after["audience"]])
        return changes

    @property
    def details(self) -> list[str]:
        """What a session row (or an undo) says beyond the diff: summary, reason, stats, token figures."""
        data, lines = self.row.data, []
        if data.get("summary"):
            lines.append(f"Summary: {data['summary']}")
        if data.get("reason"):
            lines.append(f"Reason: {data['reason']}")
        if data.get("stats"):
            lines.append(", ".join(f"{k} {v}" for k, v in data["stats"].items() if v) or "no changes")
        if "tokens_before" in data:
            after = f" → {data['tokens_after']:,}" if "tokens_after" in data else ""
            lines.append(f"Core tokens {data['tokens_before']:,}{after}")
        if "restored" in data:
            lines.append(f"Restored {data['restored']} change{'' if data['restored'] == 1 else 's'}")
        if data.get("undo_of"):
            lines.append(f"Undoes change #{data['undo_of']}")
        if data.get("merged_into"):
            lines.append(f"Merged into memory #{data['merged_into']}")
        if data.get("source_message_ids"):  # the turns a consolidation's memory named
            lines.append("Drawn from messages " + ", ".join(f"#{i}" for i in data["source_message_ids"]))
        if data.get("proposal_id"):
            outcome = ", ".join(f"{data[k]} {k}" for k in ("applied", "rejected", "stale") if data.get(k))
            lines.append(f"Proposal #{data['proposal_id']}" + (f": {outcome}" if outcome else ""))
        return lines


def build_entries(results: list[Any]) -> list[Entry]:
    """Entries for (AuditLog, email, agent name) results, each marked with the change that undid it."""
    entries = [Entry(row, email, name) for row, email, name in results]
    memory_ids = {e.row.auditable_id for e in entries if e.is_memory_change}
    if memory_ids:
        undoing = db.session.execute(
            sa.select(AuditLog.id, AuditLog.data).where(
                AuditLog.account_id == current_user.account_id,
                AuditLog.auditable_type == "AgentMemory",
                AuditLog.auditable_id.in_(memory_ids),
                AuditLog.action.in_(UNDOING),
            )
        )
        undone = {data.get("undo_of"): row_id for row_id, data in undoing}
        for entry in entries:
            entry.undone_by = undone.get(entry.row.id)
    return entries
