"""MCP's errors as its clients read them: a JSON-RPC error object, `{"jsonrpc", "id", "error": {"code",
"message", "data"}}`, whatever the HTTP status. The id is null: the request is refused before its body is read.
The SDK's client shows the message of such a body; of any other body only "Server returned an error response"."""

import json

# JSON-RPC's code for a request the server will not take, as the SDK's own transport uses it.
INVALID_REQUEST = -32600
SERVER_ERROR = -32000  # the first of JSON-RPC's codes for a server's own errors: busy, or not running


def error_body(status: int, message: str, reason: str) -> bytes:
    """The JSON-RPC error for an HTTP refusal: `data` carries the status and a stable reason
    (invalid_api_key, origin_not_allowed, rate_limit_exceeded, ...)."""
    code = SERVER_ERROR if status == 429 or status >= 500 else INVALID_REQUEST
    error = {"code": code, "message": message, "data": {"status": status, "reason": reason}}
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
