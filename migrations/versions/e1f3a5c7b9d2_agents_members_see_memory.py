"""agents.members_see_memory: what members may see of an agent's memory from a chat

Revision ID: e1f3a5c7b9d2
Revises: c4e6a8b0d2f1
Create Date: 2026-11-24 10:00:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "e1f3a5c7b9d2"
down_revision = "c4e6a8b0d2f1"
branch_labels = None
depends_on = None

VISIBILITY = sa.Enum(
    "prompt", "core", "none", name="memory_visibility", native_enum=False, create_constraint=True
)


def upgrade():
    # Reviewed by hand: every agent keeps what members saw until now, everything its prompt holds.
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("members_see_memory", VISIBILITY, server_default="prompt", nullable=False)
        )


def downgrade():
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_agents_memory_visibility"), type_="check")
        batch_op.drop_column("members_see_memory")
