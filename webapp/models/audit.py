from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from webapp.extensions import JSON, db
from webapp.timeutil import utcnow


class AuditLog(db.Model):
    """One row per change to a memory (or other governed record), by a person, an agent or a job."""

    __tablename__ = "audit_logs"
    __table_args__ = (
        sa.Index("ix_audit_logs_auditable", "auditable_type", "auditable_id"),
        sa.Index("ix_audit_logs_account_id_created_at", "account_id", "created_at"),
        sa.Index("ix_audit_logs_agent_id_created_at", "agent_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"))
    # None when a job acted (as the agent named by agent_id).
    user_id: Mapped[int | None] = mapped_column(sa.ForeignKey("users.id"))
    agent_id: Mapped[int | None] = mapped_column(sa.ForeignKey("agents.id"))
    action: Mapped[str] = mapped_column(sa.String(80), index=True)
    auditable_type: Mapped[str] = mapped_column(sa.String(50))
    auditable_id: Mapped[int]
    # A refinement session (or other batch) groups its rows under one id, so it can be rolled back whole.
    session_id: Mapped[str | None] = mapped_column(sa.String(36), index=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    @classmethod
    def record(
        cls,
        action: str,
        target: db.Model,
        *,
        account_id: int,
        agent_id: int | None = None,
        user_id: int | None = None,
        session_id: str | None = None,
        **data: Any,
    ) -> "AuditLog":
        """Add (not commit) an audit row for a change to target, so it commits with the change itself."""
        row = cls(
            action=action,
            auditable_type=type(target).__name__,
            auditable_id=target.id,
            account_id=account_id,
            agent_id=agent_id,
            user_id=user_id,
            session_id=session_id,
            data=data,
        )
        db.session.add(row)
        return row
