"""SQLite: the vector tables and the query planner's statistics tables are made here, not by a job at first use

Revision ID: e2a4c6e8f0b2
Revises: b8d0f2a4c6e9
Create Date: 2026-11-28 01:00:00

Written by hand. SQLite's schema must not change while the web and the workers use the database: a statement of
another connection being prepared just then fails ("vtable constructor failed: messages_fts", "database schema
has changed"), and a reply failed so when the first embedding made the vector tables beside it. Made here, the
vector tables are there before any embedding (webapp.search.sqlite), and the hourly ANALYZE
(webapp.jobs.term_stats) writes into sqlite_stat1 rather than making it. `ANALYZE sqlite_schema` makes the
statistics tables without statistics: the planner goes on guessing until the first hourly run, as before.
"""

from alembic import op

# revision identifiers, used by Alembic.
revision = "e2a4c6e8f0b2"
down_revision = "b8d0f2a4c6e9"
branch_labels = None
depends_on = None

# A vector per row and model (float32 blobs of any dimensions), as webapp.search.sqlite reads them.
VECTOR_TABLES = {"memory_vectors": ("memory_id", "agent_id"), "message_vectors": ("message_id", "chat_id")}


def upgrade():
    if op.get_bind().dialect.name != "sqlite":
        return  # PostgreSQL changes its schema transactionally; its vector tables need pgvector, made at first use
    for table, (key, owner) in VECTOR_TABLES.items():
        op.execute(
            f"CREATE TABLE IF NOT EXISTS {table} ({key} INTEGER NOT NULL, {owner} INTEGER NOT NULL, "
            f"model TEXT NOT NULL, bits BLOB NOT NULL, embedding BLOB NOT NULL, PRIMARY KEY ({key}, model))"
        )
        op.execute(f"CREATE INDEX IF NOT EXISTS ix_{table}_scan ON {table} ({owner}, model, bits, {key})")
    op.execute("ANALYZE sqlite_schema")


def downgrade():
    pass  # the tables stay: before this revision, the first embedding and the first ANALYZE made them
