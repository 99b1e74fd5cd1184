"""API keys: how a client other than Cairn's pages (an OpenAI-compatible client, an MCP client, a script) acts
as one person. A key is shown once when made and stored only as its SHA-256; it acts as its person (their
account, role and what they may read) and nothing more, until it is revoked or its person is removed.

A request from an API client (/v1, MCP at /mcp, `flask mcp`) acts as the person of the live key in its
`Authorization: Bearer <key>` header (key_for_bearer, person_for_bearer), and nothing more. No cookie, no CSRF
token: a request without a good key is refused whatever cookies it carries."""

import hashlib
import secrets
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column, relationship

from webapp.extensions import db
from webapp.models.accounts import User
from webapp.timeutil import utcnow

PREFIX = "cairn_"
MAX_NAME_CHARS = 80
SHOWN_CHARS = len(PREFIX) + 6  # how much of a key its list shows, to tell keys apart
LAST_USED_EVERY = timedelta(minutes=1)  # a key's last use is written at most this often: reads need not write
MAX_SECRET_CHARS = 200  # far longer than any key: nothing to hash


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


def bearer_secret(header: str | None) -> str | None:
    """The secret of an `Authorization: Bearer <secret>` header (the scheme in any case), else None."""
    scheme, _, secret = (header or "").strip().partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not secret or len(secret) > MAX_SECRET_CHARS:
        return None
    return secret


def key_for_bearer(header: str | None) -> ApiKey | None:
    """The live API key (not revoked, its person not removed) that this Authorization header carries, else None.
    Its last use is recorded, at most once a minute (that write commits the session)."""
    secret = bearer_secret(header)
    key = ApiKey.find(secret) if secret else None
    if key is not None:
        _note_use(key)
    return key


def person_for_bearer(header: str | None) -> User | None:
    """The person whose live API key this Authorization header carries (`Bearer <key>`), else None: the one
    check of a key, for /v1 and /mcp alike."""
    key = key_for_bearer(header)
    return key.user if key is not None else None


def _note_use(key: ApiKey) -> None:
    now = utcnow()
    if key.last_used_at is not None and key.last_used_at > now - LAST_USED_EVERY:
        return
    stale = sa.or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at <= now - LAST_USED_EVERY)
    # Conditional, so requests arriving together write it once.
    db.session.execute(sa.update(ApiKey).where(ApiKey.id == key.id, stale).values(last_used_at=now))
    db.session.commit()
