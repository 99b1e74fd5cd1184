"""Asking agents in a chat: a person's message posted and the agents asked to reply, committed, then the chat's
open pages told. The chat page and /v1 post through here, so an agent is asked the same whoever asks."""

from webapp import events
from webapp.extensions import db
from webapp.jobs.followups import after_new_message
from webapp.jobs.replies import request_replies
from webapp.models import Agent, Chat, Message, User


def post_message(chat: Chat, person: User, content: str, asked: list[Agent]) -> tuple[Message, list[Message]]:
    """Post a person's message and ask these agents (the paused ones excepted) to reply: commit, then tell the
    chat's open pages. Cairn's pages and its API clients post alike."""
    posted = chat.add_message(role="user", content=content, user=person, status="done")
    replies = request_replies(chat, [a for a in asked if not a.paused])
    after_new_message(chat)
    db.session.commit()
    announce_new(chat, [posted, *replies])
    return posted, replies


def ask_agents(chat: Chat, agents: list[Agent]) -> list[Message]:
    """Ask these agents (none of them paused) to reply one after another, with no new message: commit, then tell
    the chat's open pages."""
    replies = request_replies(chat, agents)
    db.session.commit()
    announce_new(chat, replies)
    return replies


def announce_new(chat: Chat, messages: list[Message]) -> None:
    """Tell the chat's open pages about new messages, so other people's messages arrive live."""
    for posted in messages:
        events.publish(chat.id, "new", posted.id)
