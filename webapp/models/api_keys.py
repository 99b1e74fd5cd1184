"""API keys: how a client other than Cairn's pages (an OpenAI-compatible client, an MCP client, a script) acts
as one person. A key is shown once when made and stored only as its SHA-256; it acts as its person (their
account, role and what they may read) and nothing more, until it is revoked or its person is removed."""

import hashlib
import secrets
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.extensions import db
from webapp.models.accounts import User
from webapp.timeutil import utcnow

PREFIX = "cairn_"
MAX_NAME_CHARS = 80
SHOWN_CHARS = len(PREFIX) + 6  # how much of a key its list shows, to tell keys apart


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class ApiKey(db.Model):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(sa.ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(sa.String(MAX_NAME_CHARS))
    shown: Mapped[str] = mapped_column(sa.String(SHOWN_CHARS))  # the key's first characters
    key_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]

    user: Mapped[User] = relationship(backref="api_keys")

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @classmethod
    def issue(cls, user: User, name: str) -> tuple["ApiKey", str]:
        """A new key of this person (added, not committed) and its secret, which is never stored."""
        secret = PREFIX + secrets.token_urlsafe(32)
        key = cls(
            user=user,
            name=name.strip()[:MAX_NAME_CHARS],
            shown=secret[:SHOWN_CHARS],
            key_hash=_digest(secret),
        )
        db.session.add(key)
        return key, secret

    @classmethod
    def find(cls, secret: str) -> "ApiKey | None":
        """The live key with this secret (not revoked, its person not removed), else None."""
        if not secret.startswith(PREFIX):
            return None
        return db.session.scalar(
            sa.select(cls)
            .join(User, User.id == cls.user_id)
            .where(cls.key_hash == _digest(secret), cls.revoked_at.is_(None), User.removed_at.is_(None))
        )

    def revoke(self) -> None:
        self.revoked_at = utcnow()
