"""The person an API key acts as, for the MCP server (over HTTP, and `flask mcp serve --key`)."""

from datetime import timedelta

from webapp.extensions import db
from webapp.models.api_keys import ApiKey
from webapp.timeutil import utcnow

LAST_USE_PRECISION = timedelta(minutes=1)  # a key's last use is written at most once a minute


def live_key(secret: str) -> ApiKey | None:
    """The live key with this secret (not revoked, its person not removed), its last use noted; else None.

    The one place the MCP server checks a key: when the /v1 endpoint's bearer helper lands, it can take this
    function's place."""
    key = ApiKey.find(secret.strip())
    if key is None:
        return None
    now = utcnow()
    if key.last_used_at is None or now - key.last_used_at > LAST_USE_PRECISION:
        key.last_used_at = now
        db.session.commit()
    return key
