"""agent_memories: an index of what a search's scope asks of a memory, so the scope is read from the index alone

Revision ID: f3a5c7e9d1b4
Revises: e2f4a6c8b0d1
Create Date: 2026-11-26 03:30:00

"""

from alembic import op

# revision identifiers, used by Alembic.
revision = "f3a5c7e9d1b4"
down_revision = "e2f4a6c8b0d1"
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand. The prompt's relevance search and recall keep an agent's active memories that may be
    # heard where they are used; with this index that set is read without the rows (bench.prompt_memory, an
    # agent of 10,000 memories: relevance cost 105 ms of CPU without it, 70 with it, on a busy machine).
    op.create_index(
        "ix_agent_memories_search_scope",
        "agent_memories",
        ["agent_id", "deleted_at", "constitutional", "audience", "chat_id"],
    )


def downgrade():
    op.drop_index("ix_agent_memories_search_scope", table_name="agent_memories")
