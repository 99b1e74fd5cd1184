import re
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, contains_eager, joinedload, mapped_column, relationship

from webapp.extensions import JSON, db
from webapp.models import public_ids
from webapp.models.agents import Agent
from webapp.timeutil import utcnow

CHAT_VISIBILITIES = ("private", "shared")  # private: its people only; shared: everyone of the account
CHAT_SOURCES = ("web", "api", "mcp")  # where it was started: Cairn's pages, the OpenAI-compatible API, or MCP
MESSAGE_ROLES = ("user", "assistant", "system", "tool")
MESSAGE_STATUSES = ("pending", "streaming", "done", "failed")
SUMMARY_COOLDOWN = timedelta(minutes=5)  # spec 003: at most one summary per agent and chat in this time
ACTIVE_WINDOW = timedelta(hours=6)  # spec 003: a conversation updated this recently counts as active
OTHER_CONVERSATIONS_LIMIT = 10


class Chat(db.Model):
    __tablename__ = "chats"
    __table_args__ = (
        sa.Index("ix_chats_account_id_last_message_at", "account_id", "last_message_at"),
        # One chat per person, agent and client's conversation id, however many requests race to make it
        # (webapp.api.conversations.chat_for). NULLs are distinct: chats without an id are not constrained.
        sa.UniqueConstraint(
            "started_by_id", "client_agent_id", "client_conversation_id", name="uq_chats_client_conversation"
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"))
    title: Mapped[str] = mapped_column(sa.String(200), default="")
    # Who may read it (webapp.models.access): its people only, or everyone of the account.
    visibility: Mapped[str] = mapped_column(
        sa.Enum(*CHAT_VISIBILITIES, name="chat_visibility", native_enum=False, create_constraint=True),
        default="private",
    )
    # Who started it; None for the chats made before chats had people.
    started_by_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id"))
    source: Mapped[str] = mapped_column(
        sa.Enum(*CHAT_SOURCES, name="chat_source", native_enum=False, create_constraint=True), default="web"
    )
    # The id an API client gave the conversation (X-Cairn-Conversation, metadata.conversation_id or `user`).
    client_conversation_id: Mapped[str | None] = mapped_column(sa.String(200))
    # The agent that id names a conversation with: a client's id is per person and agent.
    client_agent_id: Mapped[int | None] = mapped_column(sa.ForeignKey("agents.id"))
    # True for a group chat: agents answer only when asked.
    manual_responses: Mapped[bool] = mapped_column(default=False)
    # False for a temporary chat (issue 42): nothing of it is remembered, summarised, borrowed or searched from
    # another chat, and its people can delete it for good.
    remembers: Mapped[bool] = mapped_column(default=True, server_default=sa.true())
    discarded_at: Mapped[datetime | None]
    # Who discarded it (one of its people: see webapp.models.access.may_govern), for everyone to see.
    discarded_by_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id"))
    # Spec 000: the chat as a whole is consolidated once every agent's cursor has passed this message.
    last_consolidated_at: Mapped[datetime | None] = mapped_column(index=True)
    last_consolidated_message_id: Mapped[int | None]
    # Spec 004: summary of the history up to compacted_through_message_id.
    memory_doc: Mapped[str] = mapped_column(sa.Text, default="")
    compacted_through_message_id: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # Activity means a new message: set when one is added (the creation time until then), never by the jobs
    # that write the chat (consolidation, compaction). The chat list, the consolidation finder and the
    # other-conversations window go by it.
    last_message_at: Mapped[datetime] = mapped_column(default=utcnow)

    chat_agents: Mapped[list["ChatAgent"]] = relationship(
        back_populates="chat", order_by="ChatAgent.id", cascade="all, delete-orphan"
    )
    agents: Mapped[list[Agent]] = relationship(
        secondary="chat_agents", order_by="ChatAgent.id", viewonly=True
    )
    discarded_by: Mapped["User | None"] = relationship(foreign_keys=[discarded_by_id])  # noqa: F821
    chat_people: Mapped[list["ChatPerson"]] = relationship(
        back_populates="chat", order_by="ChatPerson.created_at", cascade="all, delete-orphan"
    )

    @property
    def display_title(self) -> str:
        """The title people see in the app (models see model_title)."""
        return self.title or f"Conversation {self.id}"

    @property
    def is_private(self) -> bool:
        return self.visibility == "private"

    @property
    def is_discarded(self) -> bool:
        return self.discarded_at is not None

    @property
    def public_id(self) -> str:
        """The opaque id agents see for this chat (never the database id)."""
        return public_ids.encode(self.id)

    @property
    def model_title(self) -> str:
        """The one title every model sees: the chat's own, or a placeholder that never reveals the database id."""
        return self.title or "Untitled conversation"

    @classmethod
    def start(
        cls,
        person: "User",  # noqa: F821
        agents: list[Agent],
        *,
        title: str = "",
        source: str = "web",
        client_conversation_id: str | None = None,
        remembers: bool = True,
    ) -> "Chat":
        """A new chat of these agents, private to the person who starts it (added, not committed): with one
        agent it answers every message, with several they answer when asked. Cairn's pages and its API clients
        start chats alike; `source` says which. `remembers` False: a temporary chat."""
        chat = cls(
            account_id=person.account_id,
            title=title,
            visibility="private",
            started_by_id=person.id,
            source=source,
            client_conversation_id=client_conversation_id,
            client_agent_id=agents[0].id if client_conversation_id else None,
            manual_responses=len(agents) > 1,
            chat_people=[ChatPerson(user_id=person.id, added_by_id=person.id)],
            remembers=remembers,
        )
        chat.chat_agents = [ChatAgent(agent=agent) for agent in agents]
        db.session.add(chat)
        return chat

    def mentioned_agents(self, text: str) -> list[Agent]:
        """The chat's agents named as @Name in text, in the order they are first mentioned."""
        lowered = text.lower()
        found = []
        for agent in self.agents:
            match = re.search(rf"(?<![\w@])@{re.escape(agent.name.lower())}(?![\w])", lowered)
            if match:
                found.append((match.start(), agent))
        return [agent for _, agent in sorted(found, key=lambda pair: pair[0])]

    def add_agent(self, agent: Agent) -> "ChatAgent":
        """Add an agent that joins now: its memories come only from messages after it joined."""
        joined_after = db.session.scalar(sa.select(sa.func.max(Message.id)).where(Message.chat_id == self.id))
        link = ChatAgent(chat=self, agent=agent, last_consolidated_message_id=joined_after)
        db.session.add(link)
        return link

    def add_message(self, **fields: Any) -> "Message":
        """Add a message to the chat and mark the chat as active now."""
        message = Message(chat=self, **fields)
        db.session.add(message)
        self.last_message_at = utcnow()
        return message


class ChatPerson(db.Model):
    """A person of a chat: who started it, or was added to it. A private chat is read by its people only."""

    __tablename__ = "chat_people"
    __table_args__ = (sa.Index("ix_chat_people_user_id", "user_id"),)

    chat_id: Mapped[int] = mapped_column(sa.ForeignKey("chats.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id"), primary_key=True)
    added_by_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    chat: Mapped[Chat] = relationship(back_populates="chat_people")
    user: Mapped["User"] = relationship(foreign_keys=[user_id])  # noqa: F821


class ChatHidden(db.Model):
    """A chat someone took out of their own list (one they may read but do not govern: a shared chat they are not
    a person of); nobody else's list changes."""

    __tablename__ = "chat_hidden"

    chat_id: Mapped[int] = mapped_column(sa.ForeignKey("chats.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id"), primary_key=True, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ChatAgent(db.Model):
    __tablename__ = "chat_agents"
    __table_args__ = (
        sa.UniqueConstraint("chat_id", "agent_id", name="uq_chat_agents_chat_id_agent_id"),
        sa.Index("index_chat_agents_on_agent_summary_recency", "agent_id", "agent_summary_generated_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    chat_id: Mapped[int] = mapped_column(sa.ForeignKey("chats.id"))
    agent_id: Mapped[int] = mapped_column(sa.ForeignKey("agents.id"))
    # Spec 003: this agent's own two-line view of this chat.
    agent_summary: Mapped[str | None] = mapped_column(sa.Text)
    agent_summary_generated_at: Mapped[datetime | None]
    borrowed_context_json: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # DESIGN 5.1: consolidation progress is per agent, committed with that agent's memories.
    last_consolidated_message_id: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    chat: Mapped[Chat] = relationship(back_populates="chat_agents")
    agent: Mapped[Agent] = relationship(back_populates="chat_agents")

    def summary_stale(self) -> bool:
        """True when the agent has no summary of this chat, or it is older than the cooldown."""
        generated = self.agent_summary_generated_at
        return generated is None or generated < utcnow() - SUMMARY_COOLDOWN

    def clear_borrowed_context(self, included: dict[str, Any] | None) -> bool:
        """Clear the borrowed context if it is still the one `included` in a prompt (DESIGN 5.2).

        Context staged again since then (during the reply that just succeeded, or by another reply) has a
        different stamp and is kept for the next activation. True when something was cleared.
        """
        stamp = (included or {}).get("staged_at")
        if not stamp:
            return False
        result = db.session.execute(
            sa.update(ChatAgent)
            .where(ChatAgent.id == self.id, ChatAgent.borrowed_context_json["staged_at"].as_string() == stamp)
            .values(borrowed_context_json=sa.null())
            .execution_options(synchronize_session=False)
        )
        db.session.expire(self, ["borrowed_context_json"])
        return result.rowcount > 0


class Message(db.Model):
    __tablename__ = "messages"
    __table_args__ = (
        sa.Index("ix_messages_chat_id_id", "chat_id", "id"),
        sa.Index("ix_messages_chat_id_created_at", "chat_id", "created_at"),
        # A search's scope (the finished turns of some chats) read from the index alone.
        sa.Index("ix_messages_readable", "chat_id", "status", "role", "id"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    chat_id: Mapped[int] = mapped_column(sa.ForeignKey("chats.id"))
    role: Mapped[str] = mapped_column(
        sa.Enum(*MESSAGE_ROLES, name="message_role", native_enum=False, create_constraint=True)
    )
    content: Mapped[str] = mapped_column(sa.Text, default="")
    user_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id"), index=True)
    agent_id: Mapped[int | None] = mapped_column(sa.ForeignKey("agents.id"), index=True)
    status: Mapped[str] = mapped_column(
        sa.Enum(*MESSAGE_STATUSES, name="message_status", native_enum=False, create_constraint=True),
        default="done",
    )
    error: Mapped[str | None] = mapped_column(sa.Text)
    input_tokens: Mapped[int | None]
    output_tokens: Mapped[int | None]
    tools_used: Mapped[list[str] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    chat: Mapped[Chat] = relationship()
    user: Mapped["User | None"] = relationship()  # noqa: F821
    agent: Mapped[Agent | None] = relationship()

    def excerpt(self, limit: int) -> str:
        """The content cut to at most `limit` characters, marked with an ellipsis when cut."""
        text = self.content or ""
        return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"

    @property
    def account_id(self) -> int:
        """The account the message belongs to: its chat's."""
        return self.chat.account_id

    @property
    def author_name(self) -> str:
        if self.agent is not None:
            return self.agent.name
        if self.user is not None:
            return self.user.display_name
        return "System" if self.role == "system" else "User"


def other_conversations(
    account_id: int, agent_ids: list[int], exclude_chat_id: int, *, heard: sa.ColumnElement[bool]
) -> sa.Select:
    """The agents' summaries of their other active chats that may be heard where they are shown, newest first:
    one query for any number of agents.

    `heard` is webapp.models.access.chats_heard_in(the chat they are shown in): a chat everyone present there
    may read, so a private chat's summary is never shown where someone who may not read it is listening.
    Active: in the account, not discarded, a message within ACTIVE_WINDOW, with a non-blank summary. Each agent
    gets at most ten rows (a window function keeps the query single).
    """
    rank = (
        sa.func.row_number()
        .over(partition_by=ChatAgent.agent_id, order_by=(Chat.last_message_at.desc(), Chat.id.desc()))
        .label("rank")
    )
    ranked = (
        sa.select(ChatAgent.id, rank)
        .join(Chat, Chat.id == ChatAgent.chat_id)
        .where(
            ChatAgent.agent_id.in_(agent_ids),
            ChatAgent.chat_id != exclude_chat_id,
            heard,
            sa.func.trim(sa.func.coalesce(ChatAgent.agent_summary, "")) != "",
            Chat.account_id == account_id,
            Chat.discarded_at.is_(None),
            Chat.last_message_at > utcnow() - ACTIVE_WINDOW,
        )
        .subquery()
    )
    return (
        sa.select(ChatAgent)
        .join(ranked, ranked.c.id == ChatAgent.id)
        .join(ChatAgent.chat)
        .options(contains_eager(ChatAgent.chat))
        .where(ranked.c.rank <= OTHER_CONVERSATIONS_LIMIT)
        .order_by(ChatAgent.agent_id, Chat.last_message_at.desc(), Chat.id.desc())
    )


def other_conversation_summaries(
    agent: Agent, exclude_chat_id: int, *, heard: sa.ColumnElement[bool]
) -> list[ChatAgent]:
    """The agent's summaries of its other active chats that `heard` admits (at most 10, most recently updated
    first)."""
    query = other_conversations(agent.account_id, [agent.id], exclude_chat_id, heard=heard)
    return list(db.session.scalars(query))


def recent_messages(chat_id: int, limit: int) -> list[Message]:
    """The chat's last `limit` finished user and assistant messages, oldest first, with their authors."""
    newest_first = db.session.scalars(
        sa.select(Message)
        .options(joinedload(Message.user), joinedload(Message.agent))
        .where(
            Message.chat_id == chat_id,
            Message.role.in_(("user", "assistant")),
            Message.status == "done",
            Message.content != "",
        )
        .order_by(Message.id.desc())
        .limit(limit)
    ).all()
    return newest_first[::-1]
