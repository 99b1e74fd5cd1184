"""Hourly: delete for good the temporary chats their people asked to have deleted after some days
(webapp.actions.temporary_chats)."""

from webapp.actions.temporary_chats import delete_expired
from webapp.jobs.queue import recorded_job
from webapp.timeutil import utcnow


@recorded_job("delete_temporary_chats", "Delete expired temporary chats", unique="active")
def delete_expired_temporary_chats() -> dict[str, int]:
    return {"deleted": delete_expired(utcnow())}
