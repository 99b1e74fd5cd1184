from datetime import datetime

import sqlalchemy as sa
from slugify import slugify
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.extensions import JSON, db
from webapp.models.accounts import Account, User
from webapp.timeutil import utcnow

DEFAULT_CORE_TOKEN_BUDGET = 5000
# What a new agent may call, however it is created (the agent form, the demo seed, a bare Agent()): every reply
# tool (webapp.tools.REPLY_TOOLS, named here as the tools import the models; tests/test_default_tools.py checks).
DEFAULT_TOOLS = ("save_memory", "recall", "borrow_context")
# What members may see of an agent's memory from a chat: everything its prompt holds, its core memories only,
# or nothing. Admins always see what the prompt holds (and the ledger).
MEMORY_VISIBILITY = ("prompt", "core", "none")
MAX_SLUG_CHARS = 60
# What a name and a system prompt may be, on the agent's form and in an imported agent file alike.
NAME_MAX_CHARS = 40
NAME_PATTERN = r"^[\w][\w .'-]*$"
NAME_RULE = "Use letters, digits, spaces, dots, dashes or apostrophes."
SYSTEM_PROMPT_MAX_CHARS = 20_000
# How the merges, rewrites and deletes of its refinement sessions apply: at once, or staged as a proposal that an
# admin approves (webapp.models.proposals). Additions (consolidation, reflection's promotions) always apply at once.
BACKGROUND_CHANGES = ("automatic", "staged")


class Agent(db.Model):
    __tablename__ = "agents"
    __table_args__ = (
        sa.UniqueConstraint("account_id", "name", name="uq_agents_account_id_name"),
        sa.UniqueConstraint("account_id", "slug", name="uq_agents_account_id_slug"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(sa.ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(sa.String(80))
    # Its id for API clients (the `model` of /v1): made from its name when it is created (slug_for), unique in
    # the account, and kept when it is renamed, so clients keep working.
    slug: Mapped[str] = mapped_column(sa.String(MAX_SLUG_CHARS))
    system_prompt: Mapped[str] = mapped_column(sa.Text, default="")
    # Its model: an id at its connection (webapp.models.connections; None: the environment's connection, as for
    # every agent made before connections).
    connection_id: Mapped[int | None] = mapped_column(sa.ForeignKey("connections.id"), index=True)
    model_id: Mapped[str] = mapped_column(sa.String(200))
    enabled_tools: Mapped[list[str]] = mapped_column(JSON, default=lambda: list(DEFAULT_TOOLS))
    core_token_budget: Mapped[int] = mapped_column(default=DEFAULT_CORE_TOKEN_BUDGET)
    # Tokens of memory listed in each of its prompts (None: the MEMORY_TOKEN_BUDGET setting).
    memory_token_budget: Mapped[int | None]
    members_see_memory: Mapped[str] = mapped_column(
        sa.Enum(*MEMORY_VISIBILITY, name="memory_visibility", native_enum=False, create_constraint=True),
        default="prompt",
    )
    last_refinement_at: Mapped[datetime | None]
    paused: Mapped[bool] = mapped_column(default=False)
    # Whether consolidation turns its idle one-to-one chats into memories too (group chats it always does).
    consolidates_direct_chats: Mapped[bool] = mapped_column(default=True)
    # New agents stage their background changes for review; agents made before issue 23 kept "automatic".
    background_changes: Mapped[str] = mapped_column(
        sa.Enum(*BACKGROUND_CHANGES, name="background_changes", native_enum=False, create_constraint=True),
        default="staged",
    )
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    account: Mapped[Account] = relationship()
    connection: Mapped["Connection | None"] = relationship()  # noqa: F821
    chat_agents: Mapped[list["ChatAgent"]] = relationship(back_populates="agent")  # noqa: F821

    @staticmethod
    def slug_for(account_id: int, name: str, taken: set[str] | None = None) -> str:
        """A slug of the name unique in the account: lower-case ASCII words joined by hyphens, other scripts
        transliterated ("Zoë" -> "zoe", "Юля" -> "iulia"), "agent" when nothing is left (an emoji); a slug taken
        by another agent of the account gets -2, -3, …"""
        if taken is None:
            taken = set(db.session.scalars(sa.select(Agent.slug).where(Agent.account_id == account_id)))
        base = slugify(name, max_length=MAX_SLUG_CHARS - 4) or "agent"
        slug, n = base, 1
        while slug in taken:
            n += 1
            slug = f"{base}-{n}"
        return slug

    @staticmethod
    def by_slug(account_id: int, slug: str) -> "Agent | None":
        """The account's agent a client names by its slug (`model` of /v1, /mcp/<slug>): slugs are lower-case, so
        a client's "Ada" or " ada " finds "ada", at every door alike."""
        wanted = slug.strip().lower()
        return db.session.scalar(sa.select(Agent).where(Agent.account_id == account_id, Agent.slug == wanted))

    @staticmethod
    def free_name(account_id: int, name: str) -> str:
        """The next name like `name` that no agent of the account has (case aside): "Ada 2", "Ada 3", …
        ("Ada 2" taken too leads to "Ada 3", not "Ada 2 2"), within NAME_MAX_CHARS."""
        taken = {
            n.lower() for n in db.session.scalars(sa.select(Agent.name).where(Agent.account_id == account_id))
        }
        base, _, number = name.rpartition(" ")
        base, n = (base, int(number)) if base and number.isdigit() else (name, 1)
        candidate = name
        while candidate.lower() in taken:
            n += 1
            candidate = f"{base[: NAME_MAX_CHARS - len(str(n)) - 1].rstrip()} {n}"
        return candidate

    def memory_visible_to(self, user: User) -> str:
        """What this user may see of the agent's memory from a chat: "prompt", "core" or "none"."""
        return "prompt" if user.is_admin else self.members_see_memory

    def shows_memory_to(self, user: User, memory_type: str | None) -> bool:
        """Whether this user may read a memory of this type (a saved-memory chip quotes one) from a chat."""
        visible = self.memory_visible_to(user)
        return visible == "prompt" or (visible == "core" and memory_type == "core")

    def identity(self) -> str:
        """The agent's system prompt, or the plain identity the specs fall back to."""
        return self.system_prompt.strip() or f"You are {self.name}."


@sa.event.listens_for(Agent, "before_insert")
def _give_a_slug(_mapper, connection, agent: Agent) -> None:
    """Every new agent gets its slug, however it is made (the form, the demo seed, an import, a test)."""
    if not agent.slug:
        taken = set(connection.scalars(sa.select(Agent.slug).where(Agent.account_id == agent.account_id)))
        agent.slug = Agent.slug_for(agent.account_id, agent.name, taken)
