"""agents.consolidates_direct_chats: whether an agent's one-to-one chats become its memories

Revision ID: 3f6b8d0a2c41
Revises: f2a4b6c8d0e3
Create Date: 2026-11-25 10:00:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "3f6b8d0a2c41"
down_revision = "f2a4b6c8d0e3"
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: on for every agent, so the idle one-to-one chats they already have are consolidated too.
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("consolidates_direct_chats", sa.Boolean(), server_default=sa.true(), nullable=False)
        )


def downgrade():
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_column("consolidates_direct_chats")
