"""chats.discarded_by_id (who discarded a chat) and chat_hidden (a chat someone took out of their own list)

Revision ID: e8a0c2d4f6b8
Revises: d5f7b9c1e3a6
Create Date: 2026-11-27 12:15:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "e8a0c2d4f6b8"
down_revision = "d5f7b9c1e3a6"
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand: chats discarded before this say nobody in particular discarded them.
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.add_column(sa.Column("discarded_by_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_chats_discarded_by_id_users"), "users", ["discarded_by_id"], ["id"]
        )
    op.create_table(
        "chat_hidden",
        sa.Column("chat_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["chat_id"], ["chats.id"], name=op.f("fk_chat_hidden_chat_id_chats"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name=op.f("fk_chat_hidden_user_id_users")),
        sa.PrimaryKeyConstraint("chat_id", "user_id", name=op.f("pk_chat_hidden")),
    )
    with op.batch_alter_table("chat_hidden", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_chat_hidden_user_id"), ["user_id"], unique=False)


def downgrade():
    with op.batch_alter_table("chat_hidden", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_chat_hidden_user_id"))
    op.drop_table("chat_hidden")
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_chats_discarded_by_id_users"), type_="foreignkey")
        batch_op.drop_column("discarded_by_id")
