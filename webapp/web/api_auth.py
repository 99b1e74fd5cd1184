"""Who a request from an API client acts as (the OpenAI-compatible /v1, MCP at /mcp): the person of the live API
key in its `Authorization: Bearer <key>` header, with their account, role and what they may read, and nothing
more. No cookie, no CSRF token: a request without a good key is refused whatever cookies it carries."""

from datetime import timedelta

import sqlalchemy as sa

from webapp.extensions import db
from webapp.models import User
from webapp.models.api_keys import ApiKey
from webapp.timeutil import utcnow

LAST_USED_EVERY = timedelta(minutes=1)  # a key's last use is written at most this often: reads need not write
MAX_SECRET_CHARS = 200  # far longer than any key: nothing to hash


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
