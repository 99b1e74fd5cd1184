"""The MCP server over streamable HTTP: `/mcp/<agent-slug>` with `Authorization: Bearer <API key>`.

The SDK's transport is an ASGI (Starlette) app; this process serves it with uvicorn (`flask mcp http`, a process
of its own under `make run` and in deploy/). It is stateless (each POST is answered whole, as JSON, with no
session kept between requests), so it can be restarted, or run as several processes, without clients noticing.
In front of it, a gate checks each request before the SDK sees it, the key as /v1 checks it
(webapp.models.api_keys): a missing, unknown or revoked key is 401, a key past RATE_LIMIT_MCP is 429 with
Retry-After, an agent not in the key's account is 404, and a browser page of another origin is 403 (a MUST of
the MCP spec; README says what it stops); errors are JSON-RPC error objects (webapp.mcp.errors), as MCP clients read.
Only then is the body read, up to REQUEST_MAX_BYTES: a larger one is 413, a JSON-RPC error too.
"""

import logging
import math
import re
import time
from typing import Any
from urllib.parse import urlsplit

import anyio.to_thread
import uvicorn
from flask import Flask
from limits import parse_many
from limits.storage import storage_from_string
from limits.strategies import FixedWindowRateLimiter
from mcp.server.transport_security import TransportSecuritySettings
from redis.exceptions import RedisError
from starlette.types import ASGIApp, Receive, Scope, Send

from webapp.mcp.errors import error_body
from webapp.mcp.server import CALLER, Caller, build_server
from webapp.models import Agent
from webapp.models.api_keys import key_for_bearer

log = logging.getLogger(__name__)

PATH = re.compile(r"^/mcp(?:/(?P<agent>[^/]+))?/?$")


class Refusal(Exception):
    """A request answered before the MCP server sees it: its status, message and headers."""

    def __init__(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or {}


def create_asgi_app(app: Flask) -> ASGIApp:
    """The SDK's streamable HTTP app for every agent (`/mcp/{agent}`), behind the gate."""
    server = build_server(app)
    inner = server.streamable_http_app(
        streamable_http_path="/mcp/{agent}",
        stateless_http=True,
        json_response=True,
        # The SDK's DNS-rebinding guard refuses any Host but localhost, which would refuse Cairn's own address;
        # the gate checks Origin instead (same origin or MCP_ALLOWED_ORIGINS), and every request needs an API key,
        # which a rebound page cannot have.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return Gate(app, inner)


class Gate:
    """ASGI middleware: who a request acts as (its key's person and the agent its path names), or a refusal."""

    def __init__(self, app: Flask, inner: ASGIApp):
        self.app, self.inner = app, inner
        self.limits = parse_many(app.config["RATE_LIMIT_MCP"])
        storage = storage_from_string(app.config["RATELIMIT_STORAGE_URI"], **_storage_options(app))
        self.limiter = FixedWindowRateLimiter(storage)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan: the SDK's session manager starts and stops with it
            await self.inner(scope, receive, send)
            return
        try:
            scope[CALLER] = await anyio.to_thread.run_sync(self._admit, scope)
        except Refusal as refusal:
            await _refuse(send, refusal)
            return
        limit = self.app.config["REQUEST_MAX_BYTES"]
        if (receive := await _bounded_body(scope, receive, limit)) is None:
            await _too_large(send, limit)
            return
        await self.inner(scope, receive, send)

    def _admit(self, scope: Scope) -> Caller:
        """The Caller of this request (in a worker thread: the database and the limit storage block)."""
        found = PATH.match(scope["path"])
        if found is None:
            raise Refusal(404, "Not found: the MCP server is at /mcp/<agent-slug>.", "not_found")
        origin = _header(scope, b"origin")
        if origin and not self._origin_allowed(origin, _header(scope, b"host")):
            raise Refusal(
                403,
                f"Requests from {origin} may not use this MCP server: only Cairn's own pages and the origins in "
                "MCP_ALLOWED_ORIGINS may (clients outside a browser send no Origin).",
                "origin_not_allowed",
            )
        with self.app.app_context():
            key = key_for_bearer(_header(scope, b"authorization"))
            if key is None:
                raise Refusal(
                    401,
                    "Invalid or revoked API key: send Authorization: Bearer <key> with a key from your account "
                    "page.",
                    "invalid_api_key",
                    {"WWW-Authenticate": 'Bearer realm="cairn"'},
                )
            self._count(key.id)
            slug = found["agent"]
            agent = Agent.by_slug(key.user.account_id, slug) if slug else None
            if agent is None:
                raise Refusal(
                    404,
                    f"No agent {slug!r} in your account: the MCP server is at /mcp/<agent-slug> (the ids "
                    "GET /v1/models lists)."
                    if slug
                    else "Name the agent: the MCP server is at /mcp/<agent-slug>.",
                    "model_not_found",
                )
            return Caller(agent.id, user_id=key.user_id)

    def _origin_allowed(self, origin: str, host: str | None) -> bool:
        """A browser page may call only from the origin it was served at (its Host) or a configured one."""
        origin = origin.strip().rstrip("/").lower()
        same = bool(host) and urlsplit(origin).netloc == host.strip().lower()
        return same or origin in self.app.config["MCP_ALLOWED_ORIGINS"]

    def _count(self, key_id: int) -> None:
        """Count a request against the key's limits; Refusal 429 past one. A storage outage lets it through
        (as Flask-Limiter does for the pages), recorded in the log."""
        identifiers = (self.app.config.get("RATELIMIT_KEY_PREFIX", "cairn"), "mcp", f"key:{key_id}")
        try:
            for item in self.limits:
                if not self.limiter.hit(item, *identifiers):
                    reset = self.limiter.get_window_stats(item, *identifiers).reset_time
                    wait = max(1, math.ceil(reset - time.time()))
                    raise Refusal(
                        429,
                        f"Too many requests with this key (RATE_LIMIT_MCP: {item}). Try again in {wait} s.",
                        "rate_limit_exceeded",
                        {"Retry-After": str(wait)},
                    )
        except RedisError as error:
            log.warning("MCP rate limit not counted (storage unavailable): %s", error)


def _header(scope: Scope, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def _storage_options(app: Flask) -> dict[str, Any]:
    """Flask-Limiter's storage options for a Redis storage (timeouts); none for the in-memory one (tests)."""
    if app.config["RATELIMIT_STORAGE_URI"].startswith("memory://"):
        return {}
    return app.config.get("RATELIMIT_STORAGE_OPTIONS", {})


async def _refuse(send: Send, refusal: Refusal) -> None:
    body = error_body(refusal.status, str(refusal), refusal.kind)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in refusal.headers.items()]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _bounded_body(scope: Scope, receive: Receive, limit: int) -> Receive | None:
    """The body read (after the key was checked) up to `limit` bytes and replayed to the SDK; None when it is
    larger: by its Content-Length, unread, or as it arrives."""
    length = next((v for k, v in scope["headers"] if k == b"content-length"), b"0")
    if not length.isdigit() or int(length) > limit:
        return None
    chunks, size, message = [], 0, {"more_body": True}
    while message.get("more_body"):
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return None
    replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
    if message["type"] != "http.request":
        replay.append(message)

    async def replayed() -> dict:
        return replay.pop(0) if replay else await receive()

    return replayed


async def _too_large(send: Send, limit: int) -> None:
    await _refuse(
        send, Refusal(413, f"The request is larger than {limit:,} bytes (REQUEST_MAX_BYTES).", "too_large")
    )


def serve(app: Flask, host: str, port: int) -> None:
    """Serve the MCP app with uvicorn until stopped (SIGTERM or Ctrl-C ends it gracefully)."""
    uvicorn.run(create_asgi_app(app), host=host, port=port, log_level="warning")
