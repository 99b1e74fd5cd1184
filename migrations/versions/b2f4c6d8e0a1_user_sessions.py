"""user_sessions: one row per sign-in, so signing out revokes every copy of its cookies

Revision ID: b2f4c6d8e0a1
Revises: 9d3e5f7a1b22
Create Date: 2026-11-23 15:50:00

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = 'b2f4c6d8e0a1'
down_revision = '9d3e5f7a1b22'
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand. Cookies made before this carry a user id, which is no sign-in's token: everyone signs
    # in again once.
    op.create_table(
        'user_sessions',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('user_id', sa.Integer(), nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_user_sessions_user_id_users')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_user_sessions')),
        sa.UniqueConstraint('token_hash', name=op.f('uq_user_sessions_token_hash')),
    )
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_user_sessions_user_id'), ['user_id'], unique=False)


def downgrade():
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_user_sessions_user_id'))
    op.drop_table('user_sessions')
