"""Chats: one blueprint (/chats), a module per concern and common.py what they share.

Every route that takes a chat or message id finds the chat with readable_chat_or_404 (webapp.models.access): a
chat the person may not read is a 404 and nothing changes. A new chat is private to whoever started it; its people
may share it with the account, make it private again and add the account's people to it.

    listing.py     the list of chats, and starting one
    page.py        the chat page: messages a page at a time, the agents' other conversations
    messages.py    sending, asking, retrying, stopping, regenerating and editing messages
    memory.py      what an agent of the chat remembers here; the chat's conversation summary
    people.py      the chat's people and agents
    visibility.py  its title, who may read it, whether it is listed (discard, hide)
    stream.py      live updates (Server-Sent Events)
"""

from webapp.web.chats import (  # noqa: F401  (their routes join bp)
    listing,
    memory,
    messages,
    page,
    people,
    stream,
    visibility,
)
from webapp.web.chats.common import bp

__all__ = ["bp"]
