"""search: the rows waiting for their vectors, BM25 statistics for PostgreSQL, the "embedding" purpose

Revision ID: 5a7c9e1b3d60
Revises: 3f6b8d0a2c41
Create Date: 2026-11-25 23:10:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "5a7c9e1b3d60"
down_revision = "3f6b8d0a2c41"
branch_labels = None
depends_on = None

PURPOSES = ("reply", "extract", "reflect", "refine", "summarize", "compact", "check")


def _purposes(values):
    return "purpose IN (" + ", ".join(f"'{v}'" for v in values) + ")"


def upgrade():
    # Reviewed by hand. The vector tables themselves are made by webapp.search at first use: their dimensions
    # are the embedding model's, and on PostgreSQL they need the pgvector extension, which may be missing.
    op.create_table(
        "embedding_queue",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("row_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embedding_queue")),
        sa.UniqueConstraint("kind", "row_id", name=op.f("uq_embedding_queue_kind")),
    )
    op.create_table(
        "search_term_stats",
        sa.Column("table_name", sa.String(length=40), nullable=False),
        sa.Column("term", sa.Text(), nullable=False),
        sa.Column("docs", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("table_name", "term", name=op.f("pk_search_term_stats")),
    )
    op.create_table(
        "search_table_stats",
        sa.Column("table_name", sa.String(length=40), nullable=False),
        sa.Column("docs", sa.Integer(), nullable=False),
        sa.Column("mean_length", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("table_name", name=op.f("pk_search_table_stats")),
    )
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_llm_calls_llm_purpose"), type_="check")
        batch_op.create_check_constraint("llm_purpose", _purposes((*PURPOSES, "embedding")))


def downgrade():
    op.execute("DELETE FROM llm_calls WHERE purpose = 'embedding'")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("ck_llm_calls_llm_purpose"), type_="check")
        batch_op.create_check_constraint("llm_purpose", _purposes(PURPOSES))
    op.drop_table("search_table_stats")
    op.drop_table("search_term_stats")
    op.drop_table("embedding_queue")
