"""chats.last_message_at: activity means a new message, not any write to the chat

Revision ID: 7a1c2e9d4b10
Revises: 9d1e7c3a5b20
Create Date: 2026-11-23 15:30:00

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '7a1c2e9d4b10'
down_revision = '9d1e7c3a5b20'
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: added nullable, filled from each chat's newest message (or its creation), then required.
    with op.batch_alter_table('chats', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_message_at', sa.DateTime(), nullable=True))
    op.execute(
        "UPDATE chats SET last_message_at = COALESCE("
        "(SELECT MAX(messages.created_at) FROM messages WHERE messages.chat_id = chats.id), chats.created_at)"
    )
    with op.batch_alter_table('chats', schema=None) as batch_op:
        batch_op.alter_column('last_message_at', existing_type=sa.DateTime(), nullable=False)
        batch_op.drop_index('ix_chats_account_id_updated_at')
        batch_op.create_index('ix_chats_account_id_last_message_at', ['account_id', 'last_message_at'], unique=False)


def downgrade():
    with op.batch_alter_table('chats', schema=None) as batch_op:
        batch_op.drop_index('ix_chats_account_id_last_message_at')
        batch_op.create_index('ix_chats_account_id_updated_at', ['account_id', 'updated_at'], unique=False)
        batch_op.drop_column('last_message_at')
