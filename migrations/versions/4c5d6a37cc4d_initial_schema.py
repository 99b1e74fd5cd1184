"""initial schema

Revision ID: 4c5d6a37cc4d
Revises:
Create Date: 2026-11-21 22:37:42.331524

"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = "4c5d6a37cc4d"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: every table of DESIGN.md section 2, with the indexes the specs call for.
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=120), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_accounts")),
    )
    op.create_table(
        "job_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_type", sa.String(length=80), nullable=False),
        sa.Column("target", sa.String(length=120), nullable=True),
        sa.Column("rq_job_id", sa.String(length=64), nullable=True),
        sa.Column(
            "args",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "status",
            sa.Enum(
                "running", "done", "failed", name="job_run_status", native_enum=False, create_constraint=True
            ),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "counts",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_runs")),
    )
    with op.batch_alter_table("job_runs", schema=None) as batch_op:
        batch_op.create_index("ix_job_runs_job_type_started_at", ["job_type", "started_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_runs_rq_job_id"), ["rq_job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_runs_status"), ["status"], unique=False)

    op.create_table(
        "agents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("model_id", sa.String(length=200), nullable=False),
        sa.Column(
            "enabled_tools",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("core_token_budget", sa.Integer(), nullable=False),
        sa.Column("last_refinement_at", sa.DateTime(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_agents_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agents")),
        sa.UniqueConstraint("account_id", "name", name="uq_agents_account_id_name"),
    )
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_agents_account_id"), ["account_id"], unique=False)

    op.create_table(
        "chats",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("title", sa.String(length=200), nullable=False),
        sa.Column("manual_responses", sa.Boolean(), nullable=False),
        sa.Column("discarded_at", sa.DateTime(), nullable=True),
        sa.Column("last_consolidated_at", sa.DateTime(), nullable=True),
        sa.Column("last_consolidated_message_id", sa.Integer(), nullable=True),
        sa.Column("memory_doc", sa.Text(), nullable=False),
        sa.Column("compacted_through_message_id", sa.Integer(), nullable=True),
        sa.Column("compaction_threshold", sa.Integer(), nullable=True),
        sa.Column("compaction_keep_recent", sa.Integer(), nullable=True),
        sa.Column("transcript_token_budget", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_chats_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chats")),
    )
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.create_index("ix_chats_account_id_updated_at", ["account_id", "updated_at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_chats_last_consolidated_at"), ["last_consolidated_at"], unique=False
        )

    op.create_table(
        "users",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("email", sa.String(length=254), nullable=False),
        sa.Column("password_hash", sa.String(length=255), nullable=False),
        sa.Column(
            "role",
            sa.Enum("admin", "member", name="user_role", native_enum=False, create_constraint=True),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_users_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_users")),
        sa.UniqueConstraint("email", name=op.f("uq_users_email")),
    )
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_users_account_id"), ["account_id"], unique=False)

    op.create_table(
        "agent_memories",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column(
            "memory_type",
            sa.Enum("journal", "core", name="memory_type", native_enum=False, create_constraint=True),
            nullable=False,
        ),
        sa.Column("constitutional", sa.Boolean(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
        sa.Column("content_hash", sa.String(length=64), nullable=True),
        sa.Column("token_estimate", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.CheckConstraint(
            "length(content) BETWEEN 1 AND 10000", name=op.f("ck_agent_memories_content_length")
        ),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], name=op.f("fk_agent_memories_agent_id_agents")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_memories")),
    )
    with op.batch_alter_table("agent_memories", schema=None) as batch_op:
        batch_op.create_index(
            "ix_agent_memories_agent_id_memory_type_created_at",
            ["agent_id", "memory_type", "created_at"],
            unique=False,
        )
        batch_op.create_index(
            batch_op.f("ix_agent_memories_constitutional"), ["constitutional"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_agent_memories_content_hash"), ["content_hash"], unique=False)
        batch_op.create_index(batch_op.f("ix_agent_memories_deleted_at"), ["deleted_at"], unique=False)

    op.create_table(
        "audit_logs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("agent_id", sa.Integer(), nullable=True),
        sa.Column("action", sa.String(length=80), nullable=False),
        sa.Column("auditable_type", sa.String(length=50), nullable=False),
        sa.Column("auditable_id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=True),
        sa.Column(
            "data",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_audit_logs_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], name=op.f("fk_audit_logs_agent_id_agents")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_audit_logs_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_logs")),
    )
    with op.batch_alter_table("audit_logs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_audit_logs_account_id_created_at", ["account_id", "created_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_audit_logs_action"), ["action"], unique=False)
        batch_op.create_index("ix_audit_logs_agent_id_created_at", ["agent_id", "created_at"], unique=False)
        batch_op.create_index("ix_audit_logs_auditable", ["auditable_type", "auditable_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_logs_session_id"), ["session_id"], unique=False)

    op.create_table(
        "chat_agents",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chat_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("agent_summary", sa.Text(), nullable=True),
        sa.Column("agent_summary_generated_at", sa.DateTime(), nullable=True),
        sa.Column(
            "borrowed_context_json",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("last_consolidated_message_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], name=op.f("fk_chat_agents_agent_id_agents")),
        sa.ForeignKeyConstraint(["chat_id"], ["chats.id"], name=op.f("fk_chat_agents_chat_id_chats")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_chat_agents")),
        sa.UniqueConstraint("chat_id", "agent_id", name="uq_chat_agents_chat_id_agent_id"),
    )
    with op.batch_alter_table("chat_agents", schema=None) as batch_op:
        batch_op.create_index(
            "index_chat_agents_on_agent_summary_recency",
            ["agent_id", "agent_summary_generated_at"],
            unique=False,
        )

    op.create_table(
        "llm_calls",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column(
            "purpose",
            sa.Enum(
                "reply",
                "extract",
                "reflect",
                "refine",
                "summarize",
                "compact",
                "check",
                name="llm_purpose",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("agent_id", sa.Integer(), nullable=True),
        sa.Column("chat_id", sa.Integer(), nullable=True),
        sa.Column("job_run_id", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum("ok", "error", name="llm_call_status", native_enum=False, create_constraint=True),
            nullable=False,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], name=op.f("fk_llm_calls_agent_id_agents")),
        sa.ForeignKeyConstraint(["chat_id"], ["chats.id"], name=op.f("fk_llm_calls_chat_id_chats")),
        sa.ForeignKeyConstraint(
            ["job_run_id"], ["job_runs.id"], name=op.f("fk_llm_calls_job_run_id_job_runs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_llm_calls")),
    )
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.create_index("ix_llm_calls_agent_id_created_at", ["agent_id", "created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_llm_calls_chat_id"), ["chat_id"], unique=False)
        batch_op.create_index("ix_llm_calls_created_at", ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_llm_calls_job_run_id"), ["job_run_id"], unique=False)

    op.create_table(
        "messages",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chat_id", sa.Integer(), nullable=False),
        sa.Column(
            "role",
            sa.Enum(
                "user",
                "assistant",
                "system",
                "tool",
                name="message_role",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("agent_id", sa.Integer(), nullable=True),
        sa.Column(
            "status",
            sa.Enum(
                "pending",
                "streaming",
                "done",
                "failed",
                name="message_status",
                native_enum=False,
                create_constraint=True,
            ),
            nullable=False,
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("input_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column(
            "tools_used",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["agent_id"], ["agents.id"], name=op.f("fk_messages_agent_id_agents")),
        sa.ForeignKeyConstraint(["chat_id"], ["chats.id"], name=op.f("fk_messages_chat_id_chats")),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_messages_user_id_users")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
    )
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_messages_agent_id"), ["agent_id"], unique=False)
        batch_op.create_index("ix_messages_chat_id_created_at", ["chat_id", "created_at"], unique=False)
        batch_op.create_index("ix_messages_chat_id_id", ["chat_id", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_messages_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_messages_user_id"), ["user_id"], unique=False)

    # ### end Alembic commands ###


def downgrade():
    # Reviewed by hand: every table of DESIGN.md section 2, with the indexes the specs call for.
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_messages_user_id"))
        batch_op.drop_index(batch_op.f("ix_messages_created_at"))
        batch_op.drop_index("ix_messages_chat_id_id")
        batch_op.drop_index("ix_messages_chat_id_created_at")
        batch_op.drop_index(batch_op.f("ix_messages_agent_id"))

    op.drop_table("messages")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_llm_calls_job_run_id"))
        batch_op.drop_index("ix_llm_calls_created_at")
        batch_op.drop_index(batch_op.f("ix_llm_calls_chat_id"))
        batch_op.drop_index("ix_llm_calls_agent_id_created_at")

    op.drop_table("llm_calls")
    with op.batch_alter_table("chat_agents", schema=None) as batch_op:
        batch_op.drop_index("index_chat_agents_on_agent_summary_recency")

    op.drop_table("chat_agents")
    with op.batch_alter_table("audit_logs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_logs_session_id"))
        batch_op.drop_index("ix_audit_logs_auditable")
        batch_op.drop_index("ix_audit_logs_agent_id_created_at")
        batch_op.drop_index(batch_op.f("ix_audit_logs_action"))
        batch_op.drop_index("ix_audit_logs_account_id_created_at")

    op.drop_table("audit_logs")
    with op.batch_alter_table("agent_memories", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_agent_memories_deleted_at"))
        batch_op.drop_index(batch_op.f("ix_agent_memories_content_hash"))
        batch_op.drop_index(batch_op.f("ix_agent_memories_constitutional"))
        batch_op.drop_index("ix_agent_memories_agent_id_memory_type_created_at")

    op.drop_table("agent_memories")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_users_account_id"))

    op.drop_table("users")
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_chats_last_consolidated_at"))
        batch_op.drop_index("ix_chats_account_id_updated_at")

    op.drop_table("chats")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_agents_account_id"))

    op.drop_table("agents")
    with op.batch_alter_table("job_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_runs_status"))
        batch_op.drop_index(batch_op.f("ix_job_runs_rq_job_id"))
        batch_op.drop_index("ix_job_runs_job_type_started_at")

    op.drop_table("job_runs")
    op.drop_table("accounts")
    # ### end Alembic commands ###
