"""memories made before audiences are tied to the chat they came from, by the migration itself

Revision ID: f1c3e5a7b9d0
Revises: e8a0c2d4f6b8
Create Date: 2026-11-27 12:20:00

"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "f1c3e5a7b9d0"
down_revision = "e8a0c2d4f6b8"
branch_labels = None
depends_on = None

BATCH = 1000

memories = sa.table(
    "agent_memories",
    sa.column("id", sa.Integer),
    sa.column("agent_id", sa.Integer),
    sa.column("chat_id", sa.Integer),
    sa.column("audience", sa.String),
    sa.column("content", sa.Text),
    sa.column("memory_type", sa.String),
    sa.column("constitutional", sa.Boolean),
    sa.column("deleted_at", sa.DateTime),
)
audit = sa.table(
    "audit_logs",
    sa.column("id", sa.Integer),
    sa.column("account_id", sa.Integer),
    sa.column("user_id", sa.Integer),
    sa.column("agent_id", sa.Integer),
    sa.column("action", sa.String),
    sa.column("auditable_type", sa.String),
    sa.column("auditable_id", sa.Integer),
    sa.column("session_id", sa.String),
    sa.column("data", sa.JSON),
    sa.column("created_at", sa.DateTime),
)
agents = sa.table("agents", sa.column("id", sa.Integer), sa.column("account_id", sa.Integer))
chats = sa.table("chats", sa.column("id", sa.Integer), sa.column("account_id", sa.Integer))


def upgrade():
    # Reviewed by hand. What `flask memories backfill-audience` did when an operator remembered to run it: a memory
    # with no chat whose creation audit row names a chat of its account is tied to that chat (heard by whoever may
    # read it), with an audit row of the change (undoable from the ledger). Chats made before chats had people are
    # shared, so nothing heard today goes quiet; an old chat made private since keeps its memories to its people.
    conn = op.get_bind()
    created_in = audit.c.data["chat_id"].as_integer()
    after_id = 0
    while rows := conn.execute(
        sa.select(memories, agents.c.account_id, chats.c.id.label("from_chat"))
        .join(agents, agents.c.id == memories.c.agent_id)
        .join(
            audit,
            sa.and_(
                audit.c.auditable_type == "AgentMemory",
                audit.c.auditable_id == memories.c.id,
                audit.c.action == "memory_create",
            ),
        )
        .join(chats, sa.and_(chats.c.id == created_in, chats.c.account_id == agents.c.account_id))
        .where(memories.c.chat_id.is_(None), memories.c.id > after_id)
        .order_by(memories.c.id, audit.c.id)
        .limit(BATCH)
    ).all():
        _tie(conn, {row.id: row for row in reversed(rows)}.values())  # a memory created twice: its first row
        after_id = rows[-1].id


def _tie(conn, rows) -> None:
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    for row in rows:
        conn.execute(
            sa.update(memories).where(memories.c.id == row.id).values(chat_id=row.from_chat, audience="chat")
        )
    conn.execute(
        sa.insert(audit),
        [
            {
                "account_id": row.account_id,
                "user_id": None,
                "agent_id": row.agent_id,
                "action": "memory_audience",
                "auditable_type": "AgentMemory",
                "auditable_id": row.id,
                "session_id": None,
                "data": {
                    "before": _snapshot(row, "everyone"),
                    "after": _snapshot(row, "chat"),
                    "via": "migration",
                    "chat_id": row.from_chat,
                },
                "created_at": now,
            }
            for row in rows
        ],
    )


def _snapshot(row, audience: str) -> dict:
    """As AgentMemory.snapshot() writes it."""
    return {
        "content": row.content,
        "memory_type": row.memory_type,
        "constitutional": bool(row.constitutional),
        "deleted_at": row.deleted_at.isoformat() if row.deleted_at else None,
        "audience": audience,
    }


def downgrade():
    # The audiences stay: heard by fewer people than before is the safe side; the audit rows say what was done.
    pass
