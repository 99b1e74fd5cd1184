import re
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.extensions import JSON, db
from webapp.models.agents import Agent
from webapp.timeutil import utcnow

MESSAGE_ROLES = ("user", "assistant", "system", "tool")
MESSAGE_STATUSES = ("pending", "streaming", "done", "failed")


class Chat(db.Model):
    __tablename__ = "chats"
    __table_args__ = (sa.Index("ix_chats_account_id_updated_at", "account_id", "updated_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"))
    title: Mapped[str] = mapped_column(sa.String(200), default="")
    # True for a group chat: agents answer only when asked.
    manual_responses: Mapped[bool] = mapped_column(default=False)
    discarded_at: Mapped[datetime | None]
    # Spec 000: the chat as a whole is consolidated once every agent's cursor has passed this message.
    last_consolidated_at: Mapped[datetime | None] = mapped_column(index=True)
    last_consolidated_message_id: Mapped[int | None]
    # Spec 004: summary of the history up to compacted_through_message_id.
    memory_doc: Mapped[str] = mapped_column(sa.Text, default="")
    compacted_through_message_id: Mapped[int | None]
    # Per-chat overrides of the global compaction settings (None: use the global default).
    compaction_threshold: Mapped[int | None]
    compaction_keep_recent: Mapped[int | None]
    transcript_token_budget: Mapped[int | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    chat_agents: Mapped[list["ChatAgent"]] = relationship(
        back_populates="chat", order_by="ChatAgent.id", cascade="all, delete-orphan"
    )
    agents: Mapped[list[Agent]] = relationship(
        secondary="chat_agents", order_by="ChatAgent.id", viewonly=True
    )

    @property
    def display_title(self) -> str:
        return self.title or f"Conversation {self.id}"

    @property
    def is_discarded(self) -> bool:
        return self.discarded_at is not None

    def mentioned_agents(self, text: str) -> list[Agent]:
        """The chat's agents named as @Name in text, in the order they are first mentioned."""
        lowered = text.lower()
        found = []
        for agent in self.agents:
            match = re.search(rf"(?<![\w@])@{re.escape(agent.name.lower())}(?![\w])", lowered)
            if match:
                found.append((match.start(), agent))
        return [agent for _, agent in sorted(found, key=lambda pair: pair[0])]

    def add_message(self, **fields: Any) -> "Message":
        """Add a message to the chat and mark the chat as active now."""
        message = Message(chat=self, **fields)
        db.session.add(message)
        self.updated_at = utcnow()
        return message


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


class Message(db.Model):
    __tablename__ = "messages"
    __table_args__ = (
        sa.Index("ix_messages_chat_id_id", "chat_id", "id"),
        sa.Index("ix_messages_chat_id_created_at", "chat_id", "created_at"),
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

    @property
    def author_name(self) -> str:
        if self.agent is not None:
            return self.agent.name
        if self.user is not None:
            return self.user.display_name
        return "System" if self.role == "system" else "User"
