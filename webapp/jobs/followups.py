"""The background work a new user or assistant message calls for, queued in the same transaction."""

from webapp.jobs.compaction import compact_if_needed
from webapp.jobs.summaries import request_summaries
from webapp.models import Chat


def after_new_message(chat: Chat) -> None:
    """Queue the summaries that are stale (spec 003) and a compaction if the history passed its threshold (004)."""
    request_summaries(chat)
    compact_if_needed(chat)
