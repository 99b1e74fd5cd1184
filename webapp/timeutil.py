"""Cairn stores naive UTC datetimes everywhere; this is the one clock."""

from datetime import UTC, datetime


def utcnow() -> datetime:
    """The current time as naive UTC, the form every column stores."""
    return datetime.now(UTC).replace(tzinfo=None)
