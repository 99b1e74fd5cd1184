"""job_runs: queued and interrupted statuses

Revision ID: 7d1e2f3a4b5c
Revises: b2f4c6d8e0a1
Create Date: 2026-11-23 15:30:00.000000

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '7d1e2f3a4b5c'
down_revision = 'b2f4c6d8e0a1'
branch_labels = None
depends_on = None

OLD = ("running", "done", "failed")
NEW = ("queued", "running", "done", "failed", "interrupted")


def _status(values):
    return sa.Enum(*values, name="job_run_status", native_enum=False, create_constraint=True)


def upgrade():
    # Reviewed by hand: a run is recorded when it is queued, and a run whose worker died is "interrupted".
    # Alembic replaces the CHECK constraint of a non-native Enum along with the column's type.
    with op.batch_alter_table('job_runs', schema=None) as batch_op:
        batch_op.alter_column('status', existing_type=_status(OLD), type_=_status(NEW), existing_nullable=False)


def downgrade():
    op.execute("UPDATE job_runs SET status = 'failed' WHERE status IN ('queued', 'interrupted')")
    with op.batch_alter_table('job_runs', schema=None) as batch_op:
        batch_op.alter_column('status', existing_type=_status(NEW), type_=_status(OLD), existing_nullable=False)
