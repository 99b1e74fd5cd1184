"""chats have people and are private or shared; memories have an audience; people can be removed

Revision ID: 8e4a2c6f0b13
Revises: 5a7c9e1b3d60
Create Date: 2026-11-26 02:00:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "8e4a2c6f0b13"
down_revision = "5a7c9e1b3d60"
branch_labels = None
depends_on = None


def _remake_search_triggers() -> None:
    """SQLite's batch mode rebuilds agent_memories as a new table, which drops the triggers that keep its FTS5
    index in step (migration 680a29028759): make them again, as they were. The rows keep their ids and content,
    so the index itself is still right."""
    if op.get_bind().dialect.name != "sqlite":
        return
    table, fts = "agent_memories", "agent_memories_fts"
    for trigger in ("insert", "delete", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS {fts}_{trigger}")
    op.execute(
        f"CREATE TRIGGER {fts}_insert AFTER INSERT ON {table} BEGIN "
        f"INSERT INTO {fts}(rowid, content) VALUES (new.id, new.content); END"
    )
    op.execute(
        f"CREATE TRIGGER {fts}_delete AFTER DELETE ON {table} BEGIN "
        f"INSERT INTO {fts}({fts}, rowid, content) VALUES ('delete', old.id, old.content); END"
    )
    op.execute(
        f"CREATE TRIGGER {fts}_update AFTER UPDATE OF content ON {table} BEGIN "
        f"INSERT INTO {fts}({fts}, rowid, content) VALUES ('delete', old.id, old.content); "
        f"INSERT INTO {fts}(rowid, content) VALUES (new.id, new.content); END"
    )


def upgrade():
    # Reviewed by hand. Every chat made before chats had people stays readable by everyone of its account, as
    # it was (shared; its starter is unknown); new chats are private. Memories keep being heard by everyone
    # until `flask memories backfill-audience` ties them to the chats they came from (still shared, so nothing
    # heard today goes quiet).
    op.create_table(
        "chat_people",
        sa.Column("chat_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("added_by_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["chat_id"], ["chats.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.ForeignKeyConstraint(["added_by_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("chat_id", "user_id"),
    )
    op.create_index("ix_chat_people_user_id", "chat_people", ["user_id"])
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "visibility",
                sa.Enum(
                    "private", "shared", name="chat_visibility", native_enum=False, create_constraint=True
                ),
                server_default="shared",
                nullable=False,
            )
        )
        batch_op.add_column(sa.Column("started_by_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key("fk_chats_started_by_id_users", "users", ["started_by_id"], ["id"])
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.alter_column("visibility", server_default="private")
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.add_column(sa.Column("removed_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("agent_memories", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chat_id", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column(
                "audience",
                sa.Enum(
                    "chat", "everyone", name="memory_audience", native_enum=False, create_constraint=True
                ),
                server_default="everyone",
                nullable=False,
            )
        )
        batch_op.create_foreign_key("fk_agent_memories_chat_id_chats", "chats", ["chat_id"], ["id"])
        batch_op.create_index("ix_agent_memories_chat_id", ["chat_id"])
        batch_op.create_check_constraint("audience_chat", "audience = 'everyone' OR chat_id IS NOT NULL")
    _remake_search_triggers()


def downgrade():
    with op.batch_alter_table("agent_memories", schema=None) as batch_op:
        batch_op.drop_constraint("audience_chat", type_="check")
        batch_op.drop_index("ix_agent_memories_chat_id")
        batch_op.drop_constraint("fk_agent_memories_chat_id_chats", type_="foreignkey")
        batch_op.drop_column("audience")
        batch_op.drop_column("chat_id")
    _remake_search_triggers()
    with op.batch_alter_table("users", schema=None) as batch_op:
        batch_op.drop_column("removed_at")
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.drop_constraint("fk_chats_started_by_id_users", type_="foreignkey")
        batch_op.drop_column("started_by_id")
        batch_op.drop_column("visibility")
    op.drop_table("chat_people")
