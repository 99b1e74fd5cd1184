"""connections: model providers added in the app; each agent's connection, an account's background model

Revision ID: a4c6e8f0b2d4
Revises: b7d9f1a3c5e7
Create Date: 2026-11-27 11:10:00

"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision = "a4c6e8f0b2d4"
down_revision = "b7d9f1a3c5e7"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade():
    # Reviewed by hand. No data moves: the environment's provider (LLM_BASE_URL, or the bundled model) is the
    # connection of every agent with none (connection_id NULL), read from the settings each time so its key never
    # enters the database; every agent made before this keeps answering exactly as before.
    op.create_table(
        "connections",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=60), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("openai", "ollama", "local", name="connection_kind", native_enum=False, create_constraint=True),
            nullable=False,
        ),
        sa.Column("base_url", sa.String(length=500), nullable=False),
        sa.Column("api_key_secret", sa.Text(), nullable=True),
        sa.Column("headers_secret", sa.Text(), nullable=True),
        sa.Column("key_hint", sa.String(length=8), nullable=True),
        sa.Column("models", JSON, nullable=False),
        sa.Column("models_fetched_at", sa.DateTime(), nullable=True),
        sa.Column("model_settings", JSON, nullable=False),
        sa.Column("checked_at", sa.DateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["account_id"], ["accounts.id"], name=op.f("fk_connections_account_id_accounts")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_connections")),
        sa.UniqueConstraint("account_id", "name", name="uq_connections_account_id_name"),
    )
    with op.batch_alter_table("connections", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_connections_account_id"), ["account_id"], unique=False)

    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.add_column(sa.Column("connection_id", sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f("ix_agents_connection_id"), ["connection_id"], unique=False)
        batch_op.create_foreign_key(
            batch_op.f("fk_agents_connection_id_connections"), "connections", ["connection_id"], ["id"]
        )

    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("background_connection_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("background_model_id", sa.String(length=200), nullable=True))
        batch_op.create_foreign_key(
            "fk_accounts_background_connection_id_connections", "connections", ["background_connection_id"], ["id"]
        )

    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.add_column(sa.Column("connection_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_llm_calls_connection_id_connections"),
            "connections",
            ["connection_id"],
            ["id"],
            ondelete="SET NULL",
        )


def downgrade():
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_llm_calls_connection_id_connections"), type_="foreignkey")
        batch_op.drop_column("connection_id")
    with op.batch_alter_table("accounts", schema=None) as batch_op:
        batch_op.drop_constraint("fk_accounts_background_connection_id_connections", type_="foreignkey")
        batch_op.drop_column("background_model_id")
        batch_op.drop_column("background_connection_id")
    with op.batch_alter_table("agents", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_agents_connection_id_connections"), type_="foreignkey")
        batch_op.drop_index(batch_op.f("ix_agents_connection_id"))
        batch_op.drop_column("connection_id")
    with op.batch_alter_table("connections", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_connections_account_id"))
    op.drop_table("connections")
