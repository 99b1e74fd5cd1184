"""How often a person may ask: Flask-Limiter's limits, counted in the app's Redis. A person's pages and API keys
share one budget (user_key); the pages answer a limit with a notice (webapp.web.guards), /v1 in OpenAI's shape
(webapp.api.errors), both with these words and this wait."""

import time

from flask import Flask, current_app, g, request
from flask_limiter import RateLimitExceeded
from flask_limiter.util import get_remote_address
from flask_login import current_user

from webapp.extensions import limiter


def init_app(app: Flask) -> None:
    app.config.setdefault("RATELIMIT_STORAGE_URI", storage_uri(app.config["REDIS_URL"]))
    app.config.setdefault("RATELIMIT_KEY_PREFIX", "cairn")
    app.config.setdefault("RATELIMIT_STORAGE_OPTIONS", {"socket_connect_timeout": 2, "socket_timeout": 2})
    app.config.setdefault("RATELIMIT_HEADERS_ENABLED", True)
    # While Redis is down, count in this process's memory rather than refuse every post and sign-in.
    app.config.setdefault("RATELIMIT_IN_MEMORY_FALLBACK_ENABLED", True)
    app.config.setdefault("RATELIMIT_SWALLOW_ERRORS", True)
    limiter.init_app(app)


def storage_uri(redis_url: str) -> str:
    """The limits library's URI for the app's Redis (the embedded one listens on a unix socket)."""
    if redis_url.startswith("unix://"):
        return "redis+unix://" + redis_url.removeprefix("unix://")
    return redis_url


def user_key() -> str:
    """Limits per person: the one an API key acts as (g.api_person, set by /v1), else the signed-in one, so a
    person's keys and pages share one budget; an anonymous request is counted by its address."""
    if "api_person" in g:
        return f"user:{g.api_person.id}"
    if current_user.is_authenticated:
        return f"user:{current_user.id}"  # the person, not the sign-in (get_id is its secret token)
    return f"address:{get_remote_address()}"


# Posts, agent triggers, retries and edits each cost model calls: one budget per user for all of them. Only
# a POST asks an agent (the edit view's GET shows its form).
replies_limit = limiter.shared_limit(
    lambda: current_app.config["RATE_LIMIT_REPLIES"],
    scope="replies",
    key_func=user_key,
    methods=["POST"],
    error_message="You are asking the agents too often.",
)


def login_email_key() -> str:
    return "email:" + request.form.get("email", "").strip().lower()[:254]


def address_key() -> str:
    return f"address:{get_remote_address()}"


def seconds_until_allowed() -> int:
    """How long until the limit just exceeded lets the next request through."""
    current = limiter.current_limit
    return max(1, round(current.reset_at - time.time())) if current else 60


def limit_message(error: RateLimitExceeded) -> str:
    """The limit's own message and when to try again."""
    wait = seconds_until_allowed()
    when = f"{wait} seconds" if wait < 120 else f"{round(wait / 60)} minutes"
    return f"{error.description} Try again in {when}."
