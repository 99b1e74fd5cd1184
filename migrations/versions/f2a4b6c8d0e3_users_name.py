"""users.name: the name others see on a person's messages

Revision ID: f2a4b6c8d0e3
Revises: e1f3a5c7b9d2
Create Date: 2026-11-24 11:00:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "f2a4b6c8d0e3"
down_revision = "e1f3a5c7b9d2"
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: empty for everyone, who keep showing as their e-mail's local part until they choose.
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("name", sa.String(length=60), nullable=True))


def downgrade():
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("name")
