"""reply_sources: what each reply's prompt held; agents.memory_token_budget

Revision ID: 9d1e7c3a5b20
Revises: 680a29028759
Create Date: 2026-11-23 15:45:00

"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = "9d1e7c3a5b20"
down_revision = "680a29028759"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade():
    # Reviewed by hand: one row per finished reply, ids only (a deleted memory still shows it was used).
    op.create_table(
        "reply_sources",
        sa.Column("message_id", sa.Integer(), nullable=False),
        sa.Column("memory_ids", JSON, nullable=False),
        sa.Column("recalled_memory_ids", JSON, nullable=False),
        sa.Column("recalled_chat_ids", JSON, nullable=False),
        sa.Column("conversation_summary", sa.Boolean(), nullable=False),
        sa.Column("summary_chat_ids", JSON, nullable=False),
        sa.Column("borrowed_chat_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["borrowed_chat_id"], ["chats.id"], name=op.f("fk_reply_sources_borrowed_chat_id_chats")
        ),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name=op.f("fk_reply_sources_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("message_id", name=op.f("pk_reply_sources")),
    )
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("memory_token_budget", sa.Integer(), nullable=True))


def downgrade():
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("memory_token_budget")
    op.drop_table("reply_sources")
