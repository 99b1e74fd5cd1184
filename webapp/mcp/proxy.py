"""/mcp on the web process, relayed to the MCP process (webapp.mcp.http at MCP_HOST:MCP_PORT) and streamed
back: `make run` serves pages, streams and MCP on one port, as its gevent gunicorn waits on the MCP process
without holding a thread. In production the front proxy sends /mcp to the MCP process itself (README,
Production); this relay is then only a fallback. Exempt from CSRF: MCP clients send an API key, not a cookie.
A body is read only with a live key (else the MCP process refuses the request, sent without it) and only up to
REQUEST_MAX_BYTES (else 413, a JSON-RPC error).
"""

import http.client
from collections.abc import Iterator

from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from webapp.extensions import csrf, db
from webapp.mcp.errors import error_body
from webapp.models.api_keys import ApiKey, bearer_secret

bp = Blueprint("mcp", __name__)
csrf.exempt(bp)

METHODS = ["GET", "POST", "DELETE"]
# Headers that describe one connection, not the message (RFC 9110, 7.6.1): never relayed. Host is relayed: the
# MCP process compares a browser's Origin with it.
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
}
CHUNK = 64 * 1024
TIMEOUT_SECONDS = 300  # a tool call that searches a large memory, or an event stream that waits


@bp.route("/mcp", methods=METHODS, strict_slashes=False)
@bp.route("/mcp/<path:rest>", methods=METHODS)
def relay(rest: str = "") -> Response:
    """Relay the request to the MCP process and stream its answer back."""
    upstream = http.client.HTTPConnection(
        current_app.config["MCP_HOST"], current_app.config["MCP_PORT"], timeout=TIMEOUT_SECONDS
    )
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    headers["X-Forwarded-For"] = request.remote_addr or ""
    try:
        upstream.request(request.method, request.full_path.rstrip("?"), _body_with_a_live_key(), headers)
        answer = upstream.getresponse()
    except OSError:
        upstream.close()
        return _unavailable()
    relayed = [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP_BY_HOP]
    return Response(_body(upstream, answer), status=answer.status, headers=relayed, direct_passthrough=True)


def _body_with_a_live_key() -> bytes:
    """The request's body when its key is live; without one the body is never read (the gate refuses it)."""
    secret = bearer_secret(request.headers.get("Authorization"))
    live = secret is not None and ApiKey.find(secret) is not None
    db.session.close()  # the connection goes back to the pool while the MCP process answers
    return request.get_data() if live else b""


@bp.errorhandler(RequestEntityTooLarge)
def _too_large(_error: RequestEntityTooLarge) -> Response:
    """413 as a JSON-RPC error (-32600, invalid request), which MCP clients show."""
    limit = current_app.config["REQUEST_MAX_BYTES"]
    message = f"The request is larger than {limit:,} bytes (REQUEST_MAX_BYTES)."
    return Response(error_body(413, message, "too_large"), status=413, mimetype="application/json")


def _body(upstream: http.client.HTTPConnection, answer: http.client.HTTPResponse) -> Iterator[bytes]:
    """The answer as it arrives (an event stream chunk by chunk), then the connection closed."""
    try:
        while chunk := answer.read1(CHUNK):
            yield chunk
    finally:
        upstream.close()


def _unavailable() -> Response:
    message = "The MCP service is not running; it is restarted by itself within seconds."
    body = error_body(503, message, "mcp_unavailable")
    return Response(body, status=503, mimetype="application/json", headers={"Retry-After": "5"})
