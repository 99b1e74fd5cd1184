"""api_keys; agents.slug (their id for API clients); chats.source and client_conversation_id

Revision ID: c7e9a1b3d5f2
Revises: a3c5e7f9b1d2
Create Date: 2026-11-26 03:00:00

"""

import sqlalchemy as sa
from alembic import op
from slugify import slugify

# revision identifiers, used by Alembic.
revision = "c7e9a1b3d5f2"
down_revision = "a3c5e7f9b1d2"
branch_labels = None
depends_on = None


def _slugs(agents) -> dict[int, str]:
    """A slug for each (id, account_id, name), unique in its account, as Agent.slug_for makes them."""
    taken: dict[int, set[str]] = {}
    slugs = {}
    for agent_id, account_id, name in agents:
        used = taken.setdefault(account_id, set())
        base = slugify(name, max_length=56) or "agent"
        slug, n = base, 1
        while slug in used:
            n += 1
            slug = f"{base}-{n}"
        used.add(slug)
        slugs[agent_id] = slug
    return slugs


def upgrade():
    # Reviewed by hand: every agent gets its slug from its name (oldest first keeps the plain one).
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=80), nullable=False),
        sa.Column("shown", sa.String(length=12), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key_hash"),
    )
    op.create_index("ix_api_keys_user_id", "api_keys", ["user_id"])
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slug", sa.String(length=60), nullable=True))
    bind = op.get_bind()
    agents = bind.execute(sa.text("SELECT id, account_id, name FROM agents ORDER BY id")).all()
    for agent_id, slug in _slugs(agents).items():
        bind.execute(sa.text("UPDATE agents SET slug = :slug WHERE id = :id"), {"slug": slug, "id": agent_id})
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.alter_column("slug", existing_type=sa.String(length=60), nullable=False)
        batch_op.create_unique_constraint("uq_agents_account_id_slug", ["account_id", "slug"])
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "source",
                sa.Enum("web", "api", "mcp", name="chat_source", native_enum=False, create_constraint=True),
                server_default="web",
                nullable=False,
            )
        )
        batch_op.add_column(sa.Column("client_conversation_id", sa.String(length=200), nullable=True))
        batch_op.create_index(
            "ix_chats_started_by_id_client_conversation_id", ["started_by_id", "client_conversation_id"]
        )


def downgrade():
    with op.batch_alter_table("chats", schema=None) as batch_op:
        batch_op.drop_index("ix_chats_started_by_id_client_conversation_id")
        batch_op.drop_column("client_conversation_id")
        batch_op.drop_column("source")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_constraint("uq_agents_account_id_slug", type_="unique")
        batch_op.drop_column("slug")
    op.drop_index("ix_api_keys_user_id", table_name="api_keys")
    op.drop_table("api_keys")
