"""agents.background_changes; memory_proposals and proposed_changes: refinement's changes staged for review

Revision ID: e2f4a6c8b0d1
Revises: c7e9a1b3d5f2
Create Date: 2026-11-26 04:00:00

"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = "e2f4a6c8b0d1"
down_revision = "c7e9a1b3d5f2"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True)


def upgrade():
    # Reviewed by hand. Every agent made before this keeps applying its refinement's changes at once, as it did
    # ("automatic"); an agent made from now on stages them for review (the model's default, "staged").
    # agent_memories and messages are not altered (batch mode would drop their FTS5 triggers): proposed_changes
    # only points at agent_memories.
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "background_changes",
                _enum("background_changes", "automatic", "staged"),
                server_default="automatic",
                nullable=False,
            )
        )
    op.create_table(
        "memory_proposals",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.String(length=36), nullable=False),
        sa.Column("status", _enum("proposal_status", "pending", "decided", "expired"), nullable=False),
        sa.Column("staged_because", _enum("proposal_staged_because", "setting", "drift"), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.Column("decided_by_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_memory_proposals_account_id_accounts")
        ),
        sa.ForeignKeyConstraint(
            ["agent_id"], ["agents.id"], name=op.f("fk_memory_proposals_agent_id_agents")
        ),
        sa.ForeignKeyConstraint(
            ["decided_by_id"], ["users.id"], name=op.f("fk_memory_proposals_decided_by_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memory_proposals")),
        sa.UniqueConstraint("session_id", name=op.f("uq_memory_proposals_session_id")),
    )
    op.create_index("ix_memory_proposals_account_id_status", "memory_proposals", ["account_id", "status"])
    op.create_index("ix_memory_proposals_agent_id_status", "memory_proposals", ["agent_id", "status"])
    op.create_table(
        "proposed_changes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("proposal_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("kind", _enum("proposed_change_kind", "merge", "rewrite", "delete"), nullable=False),
        sa.Column("memory_ids", JSON, nullable=False),
        sa.Column("snapshots", JSON, nullable=False),
        sa.Column("content", sa.Text(), nullable=True),
        sa.Column("duplicate_of", sa.Integer(), nullable=True),
        sa.Column("tokens_before", sa.Integer(), nullable=False),
        sa.Column("tokens_after", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            _enum("proposed_change_status", "pending", "applied", "rejected", "stale"),
            nullable=False,
        ),
        sa.Column("stale_reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["duplicate_of"],
            ["agent_memories.id"],
            name=op.f("fk_proposed_changes_duplicate_of_agent_memories"),
        ),
        sa.ForeignKeyConstraint(
            ["proposal_id"],
            ["memory_proposals.id"],
            name=op.f("fk_proposed_changes_proposal_id_memory_proposals"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_proposed_changes")),
    )
    op.create_index("ix_proposed_changes_proposal_id", "proposed_changes", ["proposal_id"])


def downgrade():
    op.drop_index("ix_proposed_changes_proposal_id", table_name="proposed_changes")
    op.drop_table("proposed_changes")
    op.drop_index("ix_memory_proposals_agent_id_status", table_name="memory_proposals")
    op.drop_index("ix_memory_proposals_account_id_status", table_name="memory_proposals")
    op.drop_table("memory_proposals")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_agents_background_changes"), type_="check")
        batch_op.drop_column("background_changes")
