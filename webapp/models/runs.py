from contextvars import ContextVar
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from webapp.extensions import JSON, db
from webapp.timeutil import utcnow

LLM_PURPOSES = ("reply", "extract", "reflect", "refine", "summarize", "compact", "check", "embedding")
LLM_CALL_STATUSES = ("ok", "error")
# queued: recorded, waiting for a worker (the database is the record of work to do); interrupted: its worker
# died mid-run (webapp.jobs.queue's sweep closes it and queues the work again).
JOB_RUN_STATUSES = ("queued", "running", "done", "failed", "interrupted")

# The job_runs row of the job now executing in this context, so LLM calls can point at it.
current_job_run_id: ContextVar[int | None] = ContextVar("current_job_run_id", default=None)


class LlmCall(db.Model):
    """The cost ledger: one row per request to a model."""

    __tablename__ = "llm_calls"
    __table_args__ = (
        sa.Index("ix_llm_calls_created_at", "created_at"),
        sa.Index("ix_llm_calls_agent_id_created_at", "agent_id", "created_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    purpose: Mapped[str] = mapped_column(
        sa.Enum(*LLM_PURPOSES, name="llm_purpose", native_enum=False, create_constraint=True)
    )
    agent_id: Mapped[int | None] = mapped_column(sa.ForeignKey("agents.id"))
    chat_id: Mapped[int | None] = mapped_column(sa.ForeignKey("chats.id"), index=True)
    job_run_id: Mapped[int | None] = mapped_column(sa.ForeignKey("job_runs.id"), index=True)
    model: Mapped[str] = mapped_column(sa.String(200))
    # The connection the request went to (None: the environment's, and every request before connections).
    connection_id: Mapped[int | None] = mapped_column(sa.ForeignKey("connections.id", ondelete="SET NULL"))
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    completion_tokens: Mapped[int] = mapped_column(default=0)
    latency_ms: Mapped[int] = mapped_column(default=0)
    status: Mapped[str] = mapped_column(
        sa.Enum(*LLM_CALL_STATUSES, name="llm_call_status", native_enum=False, create_constraint=True)
    )
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobRun(db.Model):
    """One row per execution of a background job, written when it is queued (a retry is a new row)."""

    __tablename__ = "job_runs"
    __table_args__ = (sa.Index("ix_job_runs_job_type_started_at", "job_type", "started_at"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_type: Mapped[str] = mapped_column(sa.String(80))
    # The account whose data the run touched; None for runs across accounts (such as the hourly finder).
    account_id: Mapped[int | None] = mapped_column(sa.ForeignKey("accounts.id"), index=True)
    target: Mapped[str | None] = mapped_column(sa.String(120))
    rq_job_id: Mapped[str | None] = mapped_column(sa.String(64), index=True)
    args: Mapped[list[Any]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(
        sa.Enum(*JOB_RUN_STATUSES, name="job_run_status", native_enum=False, create_constraint=True),
        default="running",
        index=True,
    )
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(sa.Text)
    counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    @property
    def duration_seconds(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()
