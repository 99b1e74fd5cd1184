"""people linked to the identity provider: users.oidc_issuer/oidc_subject, one-time sign-in links (issue 43)

Revision ID: 882660db793b
Revises: 5a9960049d36
Create Date: 2026-11-29 12:35:14.028368

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '882660db793b'
down_revision = '5a9960049d36'
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: nullable columns, so existing people stay as they are (not linked, no link pending).
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.add_column(sa.Column('oidc_issuer', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('oidc_subject', sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column('sign_in_link_hash', sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint(batch_op.f('uq_users_oidc_issuer'), ['oidc_issuer', 'oidc_subject'])


def downgrade():
    with op.batch_alter_table('users', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_users_oidc_issuer'), type_='unique')
        batch_op.drop_column('sign_in_link_hash')
        batch_op.drop_column('oidc_subject')
        batch_op.drop_column('oidc_issuer')
