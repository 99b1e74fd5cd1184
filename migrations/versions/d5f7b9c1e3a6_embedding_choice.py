"""embedding choice: each account's embedder (a model at a connection, or the bundled one), the model search
ranks by while a new one's vectors are written; vectors keyed by row and model

Revision ID: d5f7b9c1e3a6
Revises: a4c6e8f0b2d4
Create Date: 2026-11-28 09:00:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "d5f7b9c1e3a6"
down_revision = "a4c6e8f0b2d4"
branch_labels = None
depends_on = None

VECTOR_TABLES = {"memory_vectors": ("memory_id", "agent_id"), "message_vectors": ("message_id", "chat_id")}


def upgrade():
    # Reviewed by hand. No data moves: an account with no embedding choice embeds as the EMBEDDING_* settings say,
    # exactly as before.
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("embedding_choice", sa.String(length=300), nullable=True))
        batch_op.add_column(sa.Column("embedding_searched", sa.String(length=300), nullable=True))
    _vectors_keyed_by_row_and_model()


def _vectors_keyed_by_row_and_model() -> None:
    """A row may hold a vector of each of two models while a new model's are written: the vector tables (made by
    webapp.search at first use, so maybe not there) take (row, model) as their key."""
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    for table, (key, owner) in VECTOR_TABLES.items():
        if not inspector.has_table(table):
            continue
        if bind.dialect.name == "postgresql":
            op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey, ADD PRIMARY KEY ({key}, model)")
            continue
        # SQLite cannot change a key: the table is copied (its vectors are plain blobs, no extension needed).
        op.execute(
            f"CREATE TABLE {table}_new ({key} INTEGER NOT NULL, {owner} INTEGER NOT NULL, model TEXT NOT NULL, "
            f"bits BLOB NOT NULL, embedding BLOB NOT NULL, PRIMARY KEY ({key}, model))"
        )
        op.execute(f"INSERT INTO {table}_new SELECT {key}, {owner}, model, bits, embedding FROM {table}")
        op.execute(f"DROP TABLE {table}")
        op.execute(f"ALTER TABLE {table}_new RENAME TO {table}")
        op.execute(f"CREATE INDEX ix_{table}_scan ON {table} ({owner}, model, bits, {key})")


def downgrade():
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    for table, (key, _owner) in VECTOR_TABLES.items():
        if inspector.has_table(table):  # one vector per row again: the newest model's kept is not known
            op.execute(f"DELETE FROM {table}")
            if bind.dialect.name == "postgresql":
                op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_pkey, ADD PRIMARY KEY ({key})")
            else:
                op.execute(f"DROP TABLE {table}")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_column("embedding_searched")
        batch_op.drop_column("embedding_choice")
