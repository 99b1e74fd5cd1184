"""full-text search over memories and messages; content_hash ignores case, spacing and punctuation

Revision ID: 680a29028759
Revises: 4b521acc2bf4
Create Date: 2026-11-23 15:40:00

Written by hand (autogenerate cannot express it, and migrations/env.py tells it to leave these objects
alone). SQLite: an external-content FTS5 table per searched table, kept in step by triggers on insert,
update of content and delete, so every write path (ORM, bulk insert, bulk update) updates the index.
PostgreSQL: a stored generated tsvector column with a GIN index, which the database computes on every write.
Both are filled here; `flask memories reindex` rebuilds them (say, after a table was rebuilt by a batch
migration on SQLite, which drops its triggers: that migration must run the reindex too).
"""

import hashlib
import re

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "680a29028759"
down_revision = "4b521acc2bf4"
branch_labels = None
depends_on = None

TABLES = ("agent_memories", "messages")
TOKENIZER = "porter unicode61 remove_diacritics 2"  # English stemming, as PostgreSQL's 'english'


def _sqlite_up(table: str) -> None:
    fts = f"{table}_fts"
    op.execute(
        f"CREATE VIRTUAL TABLE {fts} USING fts5(content, content='{table}', content_rowid='id', "
        f"tokenize='{TOKENIZER}')"
    )
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
    op.execute(f"INSERT INTO {fts}({fts}) VALUES ('rebuild')")


def _postgres_up(table: str) -> None:
    op.execute(
        f"ALTER TABLE {table} ADD COLUMN search_vector tsvector "
        "GENERATED ALWAYS AS (to_tsvector('english'::regconfig, content)) STORED"
    )
    op.execute(f"CREATE INDEX ix_{table}_search_vector ON {table} USING gin (search_vector)")


def _normalized_hash(content: str) -> str:
    # Frozen copy of webapp.models.memories.content_hash_of as of this revision.
    words = re.sub(r"[^\w\s]", " ", content.casefold()).split()
    return hashlib.sha256((" ".join(words) or content.strip().casefold()).encode()).hexdigest()


def _rehash(bind: sa.Connection) -> None:
    memories = sa.table("agent_memories", sa.column("id", sa.Integer), sa.column("content", sa.Text),
                        sa.column("content_hash", sa.String))  # fmt: skip
    rows = bind.execute(sa.select(memories.c.id, memories.c.content, memories.c.content_hash)).all()
    changed = [
        {"row_id": row.id, "hash": _normalized_hash(row.content)}
        for row in rows
        if _normalized_hash(row.content) != row.content_hash
    ]
    if changed:
        bind.execute(
            memories.update()
            .where(memories.c.id == sa.bindparam("row_id"))
            .values(content_hash=sa.bindparam("hash")),
            changed,
        )


def upgrade():
    bind = op.get_bind()
    for table in TABLES:
        (_sqlite_up if bind.dialect.name == "sqlite" else _postgres_up)(table)
    _rehash(bind)


def downgrade():
    bind = op.get_bind()
    for table in TABLES:
        if bind.dialect.name == "sqlite":
            for trigger in ("insert", "delete", "update"):
                op.execute(f"DROP TRIGGER {table}_fts_{trigger}")
            op.execute(f"DROP TABLE {table}_fts")
        else:
            op.execute(f"DROP INDEX ix_{table}_search_vector")
            op.execute(f"ALTER TABLE {table} DROP COLUMN search_vector")
