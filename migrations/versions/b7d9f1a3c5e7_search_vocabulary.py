"""SQLite: a vocabulary of each full-text index, how many rows hold each word (fts5vocab)

Revision ID: b7d9f1a3c5e7
Revises: f3a5c7e9d1b4
Create Date: 2026-11-26 06:00:00

Written by hand, as the full-text tables are (680a29028759). A search leaves out a word held by a large share
of the rows (webapp.search.terms.informative) and reads that share here; PostgreSQL keeps the same counts in
search_term_stats. An fts5vocab table stores nothing: it reads the full-text index it names.
"""

from alembic import op

# revision identifiers, used by Alembic.
revision = "b7d9f1a3c5e7"
down_revision = "f3a5c7e9d1b4"
branch_labels = None
depends_on = None

TABLES = ("agent_memories", "messages")


def upgrade():
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        op.execute(f"CREATE VIRTUAL TABLE {table}_fts_vocab USING fts5vocab({table}_fts, row)")


def downgrade():
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        op.execute(f"DROP TABLE {table}_fts_vocab")
