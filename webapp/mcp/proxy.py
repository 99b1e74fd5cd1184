"""/mcp on the web process, relayed to the MCP process (webapp.mcp.http on 127.0.0.1:MCP_PORT) and streamed
back: `make run` serves pages, streams and MCP on one port, as its gevent gunicorn waits on the MCP process
without holding a thread. In production the front proxy sends /mcp to the MCP process itself (README,
Production); this relay is then only a fallback. Exempt from CSRF: MCP clients send an API key, not a cookie.
"""

import http.client
from collections.abc import Iterator

from flask import Blueprint, Response, current_app, request

from webapp.extensions import csrf
from webapp.mcp.errors import error_body

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
        "127.0.0.1", current_app.config["MCP_PORT"], timeout=TIMEOUT_SECONDS
    )
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    headers["X-Forwarded-For"] = request.remote_addr or ""
    try:
        upstream.request(request.method, request.full_path.rstrip("?"), request.get_data(), headers)
        answer = upstream.getresponse()
    except OSError:
        upstream.close()
        return _unavailable()
    relayed = [(k, v) for k, v in answer.getheaders() if k.lower() not in HOP_BY_HOP]
    return Response(_body(upstream, answer), status=answer.status, headers=relayed, direct_passthrough=True)


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
