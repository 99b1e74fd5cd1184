"""job_runs.account_id filled in for the runs recorded before it existed

Revision ID: 9d3e5f7a1b22
Revises: 7a1c2e9d4b10
Create Date: 2026-11-23 15:35:00

"""
from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision = '9d3e5f7a1b22'
down_revision = '7a1c2e9d4b10'
branch_labels = None
depends_on = None

# The account of a run, from the first "kind:id" of its target ("chat:4", "agent:2", "chat:4 agent:2",
# "messages:17,18"). Runs without such a target (the finders, ping) stay without an account: no tenant sees them.
ACCOUNT_OF = {
    "chat": "SELECT account_id FROM chats WHERE id = :id",
    "agent": "SELECT account_id FROM agents WHERE id = :id",
    "messages": "SELECT chats.account_id FROM messages JOIN chats ON chats.id = messages.chat_id "
    "WHERE messages.id = :id",
}


def _account_of(conn, target: str):
    kind, _, ids = target.split(" ")[0].partition(":")
    first = ids.split(",")[0]
    if kind not in ACCOUNT_OF or not first.isdigit():
        return None
    return conn.execute(sa.text(ACCOUNT_OF[kind]), {"id": int(first)}).scalar()


def upgrade():
    # Reviewed by hand: data only.
    conn = op.get_bind()
    targets = conn.execute(
        sa.text("SELECT DISTINCT target FROM job_runs WHERE account_id IS NULL AND target IS NOT NULL")
    ).scalars().all()
    for target in targets:
        account_id = _account_of(conn, target)
        if account_id is not None:
            conn.execute(
                sa.text("UPDATE job_runs SET account_id = :account_id WHERE target = :target AND account_id IS NULL"),
                {"account_id": account_id, "target": target},
            )


def downgrade():
    pass  # the filled-in accounts are correct under the older schema too
