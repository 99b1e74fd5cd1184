"""chats.client_agent_id; one chat per person, agent and client's conversation id (a unique constraint)

Revision ID: d5e7f9a1b3c6
Revises: f1c3e5a7b9d0
Create Date: 2026-11-28 10:00:00

"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "d5e7f9a1b3c6"
down_revision = "f1c3e5a7b9d0"
branch_labels = None
depends_on = None


def upgrade():
    # Reviewed by hand. A client's conversation id is per person and agent (README), so the agent joins the key:
    # it is the first agent of each chat that has an id (an API chat starts with one). Requests that raced made
    # several chats with one id; the id stays with the chat it leads to now (not discarded first, then the
    # newest activity, then the newest), so a client's next turn lands where its last one did. The others keep
    # every message and stay in their person's list, only no longer named by the id.
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.add_column(sa.Column("client_agent_id", sa.Integer(), nullable=True))
    op.execute(
        "UPDATE chats SET client_agent_id = (SELECT chat_agents.agent_id FROM chat_agents "
        "WHERE chat_agents.chat_id = chats.id ORDER BY chat_agents.id LIMIT 1) "
        "WHERE client_conversation_id IS NOT NULL"
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT id, started_by_id, client_agent_id, client_conversation_id FROM chats "
            "WHERE client_conversation_id IS NOT NULL AND started_by_id IS NOT NULL "
            "ORDER BY discarded_at IS NOT NULL, last_message_at DESC, id DESC"
        )
    ).all()
    kept: set[tuple] = set()
    for chat_id, *key in rows:
        if tuple(key) in kept:
            bind.execute(
                sa.text(
                    "UPDATE chats SET client_conversation_id = NULL, client_agent_id = NULL WHERE id = :id"
                ),
                {"id": chat_id},
            )
        kept.add(tuple(key))
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.create_foreign_key("fk_chats_client_agent_id_agents", "agents", ["client_agent_id"], ["id"])
        batch_op.drop_index("ix_chats_started_by_id_client_conversation_id")
        batch_op.create_unique_constraint(
            "uq_chats_client_conversation", ["started_by_id", "client_agent_id", "client_conversation_id"]
        )


def downgrade():
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.drop_constraint("uq_chats_client_conversation", type_="unique")
        batch_op.create_index(
            "ix_chats_started_by_id_client_conversation_id", ["started_by_id", "client_conversation_id"]
        )
        batch_op.drop_constraint("fk_chats_client_agent_id_agents", type_="foreignkey")
        batch_op.drop_column("client_agent_id")
