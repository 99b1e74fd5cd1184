"""tool_servers: MCP servers an account adds as tool sources for its agents (issue 41)

Revision ID: 85089b199502
Revises: e2a4c6e8f0b2
Create Date: 2026-11-29 09:12:14.880714

"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy import Text
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = '85089b199502'
down_revision = 'e2a4c6e8f0b2'
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: MCP servers an account adds as tool sources (issue 41).
    op.create_table('tool_servers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=24), nullable=False),
    sa.Column('kind', sa.Enum('stdio', 'http', name='tool_server_kind', native_enum=False, create_constraint=True), nullable=False),
    sa.Column('command', sa.String(length=500), nullable=True),
    sa.Column('arguments', sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), 'postgresql'), nullable=False),
    sa.Column('url', sa.String(length=500), nullable=True),
    sa.Column('secrets_secret', sa.Text(), nullable=True),
    sa.Column('secret_names', sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), 'postgresql'), nullable=False),
    sa.Column('timeout_seconds', sa.Integer(), nullable=False),
    sa.Column('tools', sa.JSON().with_variant(postgresql.JSONB(astext_type=Text()), 'postgresql'), nullable=False),
    sa.Column('listed_at', sa.DateTime(), nullable=True),
    sa.Column('status', sa.String(length=8), nullable=True),
    sa.Column('status_error', sa.Text(), nullable=True),
    sa.Column('checked_at', sa.DateTime(), nullable=True),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_tool_servers_account_id_accounts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tool_servers')),
    sa.UniqueConstraint('account_id', 'name', name='uq_tool_servers_account_id_name')
    )
    with op.batch_alter_table('tool_servers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tool_servers_account_id'), ['account_id'], unique=False)

    # ### end Alembic commands ###


def downgrade():
    # Reviewed by hand: MCP servers an account adds as tool sources (issue 41).
    with op.batch_alter_table('tool_servers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tool_servers_account_id'))

    op.drop_table('tool_servers')
    # ### end Alembic commands ###
