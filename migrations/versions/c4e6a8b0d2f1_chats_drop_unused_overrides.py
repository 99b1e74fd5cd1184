"""chats: drop the per-chat compaction and transcript overrides nothing could set

Revision ID: c4e6a8b0d2f1
Revises: 7d1e2f3a4b5c
Create Date: 2026-11-23 19:00:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'c4e6a8b0d2f1'
down_revision = '7d1e2f3a4b5c'
branch_labels = None
depends_on = None

COLUMNS = ('compaction_threshold', 'compaction_keep_recent', 'transcript_token_budget')


def upgrade():
    # No page, command or job ever wrote them: every chat uses the global settings.
    with op.batch_alter_table('chats', schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.drop_column(name)


def downgrade():
    with op.batch_alter_table('chats', schema=None) as batch_op:
        for name in COLUMNS:
            batch_op.add_column(sa.Column(name, sa.Integer(), nullable=True))
