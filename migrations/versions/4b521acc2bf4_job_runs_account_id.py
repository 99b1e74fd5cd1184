"""job_runs.account_id

Revision ID: 4b521acc2bf4
Revises: 4c5d6a37cc4d
Create Date: 2026-11-21 23:07:02.802011

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '4b521acc2bf4'
down_revision = '4c5d6a37cc4d'
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: job runs name the account whose data they touched.
    with op.batch_alter_table('job_runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('account_id', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_job_runs_account_id'), ['account_id'], unique=False)
        batch_op.create_foreign_key(batch_op.f('fk_job_runs_account_id_accounts'), 'accounts', ['account_id'], ['id'])

    # ### end Alembic commands ###


def downgrade():
    # Reviewed by hand: job runs name the account whose data they touched.
    with op.batch_alter_table('job_runs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_job_runs_account_id_accounts'), type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_job_runs_account_id'))
        batch_op.drop_column('account_id')

    # ### end Alembic commands ###
