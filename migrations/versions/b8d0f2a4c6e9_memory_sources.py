"""memory_sources: the messages each memory came from (issue 33)

Revision ID: b8d0f2a4c6e9
Revises: d5e7f9a1b3c6
Create Date: 2026-11-29 10:00:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "b8d0f2a4c6e9"
down_revision = "d5e7f9a1b3c6"
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand. Memories made before have no sources: their audit rows keep the chunk a consolidation
    # read, which is no turn of its own.
    op.create_table(
        "memory_sources",
        sa.Column("memory_id", sa.Integer(), nullable=False),
        sa.Column("message_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["memory_id"],
            ["agent_memories.id"],
            name=op.f("fk_memory_sources_memory_id_agent_memories"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["message_id"],
            ["messages.id"],
            name=op.f("fk_memory_sources_message_id_messages"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("memory_id", "message_id", name=op.f("pk_memory_sources")),
    )
    with op.batch_alter_table("memory_sources", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_memory_sources_message_id"), ["message_id"], unique=False)


def downgrade():
    with op.batch_alter_table("memory_sources", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_memory_sources_message_id"))
    op.drop_table("memory_sources")
