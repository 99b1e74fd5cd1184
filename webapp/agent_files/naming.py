"""How an agent file names what it holds: rows by references of the file (m1, a1, c1, msg1), never by database
ids; times in ISO 8601 with their offset; people by name and e-mail."""

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from webapp.agent_files.schema import ref
from webapp.models import (
    User,
)


def iso(moment: datetime | None) -> str | None:
    """A stored (naive UTC) time as ISO 8601 with its offset."""
    return moment.replace(tzinfo=UTC).isoformat() if moment else None


def person(user: User | None) -> dict[str, Any] | None:
    return {"name": user.display_name, "email": user.email} if user else None


class Refs:
    """Database ids to the file's references, kind by kind, numbered in the order they are added."""

    def __init__(self) -> None:
        self.ids: dict[str, dict[int, str]] = defaultdict(dict)

    def add(self, kind: str, row_id: int) -> None:
        known = self.ids[kind]
        if row_id not in known:
            known[row_id] = ref(kind, len(known) + 1)

    def get(self, kind: str, row_id: Any) -> str | None:
        return self.ids[kind].get(row_id) if isinstance(row_id, int) else None

    def all(self, kind: str, row_ids: list[Any] | None) -> list[str]:
        return [found for row_id in row_ids or () if (found := self.get(kind, row_id))]
