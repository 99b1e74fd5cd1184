"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for everything under /v1: what the
views refuse (ApiError), rate limits (429 with Retry-After), HTTP errors, and routing's 404 and 405, which no
blueprint handler sees (Flask does not know the blueprint of a URL it could not route): those are answered before
the view would raise them."""

from flask import Blueprint, Flask, Response, jsonify, request
from flask_limiter import RateLimitExceeded
from werkzeug.exceptions import HTTPException

from webapp import limits

PREFIX = "/v1"


class ApiError(Exception):
    """A refusal the client should read: its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers or {}

    def response(self) -> Response:
        return error_response(
            self.status, self.message, kind=self.kind, param=self.param, code=self.code, headers=self.headers
        )

    def payload(self) -> dict:
        return _payload(self.message, self.kind, self.param, self.code)


def error_response(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    response = jsonify(_payload(message, kind, param, code))
    response.status_code = status
    response.headers.update(headers or {})
    return response


def _payload(message: str, kind: str, param: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def unauthorized(message: str) -> ApiError:
    return ApiError(
        401, message, code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="cairn"'}
    )


def register(bp: Blueprint) -> None:
    """The blueprint's own handlers (once, when it is made)."""
    bp.register_error_handler(ApiError, lambda error: error.response())
    bp.register_error_handler(RateLimitExceeded, _too_many)
    bp.register_error_handler(HTTPException, _http_error)
    # A status code's handler is found before a class's: without this, the app's 413 page would answer.
    bp.register_error_handler(413, _http_error)


def init_app(app: Flask) -> None:
    """Routing's 404 and 405 under /v1, app-wide: answered before the view would raise them, so the pages'
    own error handler (webapp.web.errors) never answers them."""
    app.before_request(_routing_error)


def _too_many(error: RateLimitExceeded) -> Response:
    wait = limits.seconds_until_allowed()
    return error_response(
        429,
        limits.limit_message(error),
        kind="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(wait)},
    )


def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(status)
    response = error_response(status, error.description or error.name, kind=kind, code=code)
    if status == 405 and getattr(error, "valid_methods", None):
        response.headers["Allow"] = ", ".join(error.valid_methods)
    return response


def _routing_error() -> Response | None:
    """Under /v1, a URL or method no view takes gets the client's error shape."""
    error = request.routing_exception
    if error is None or not (request.path == PREFIX or request.path.startswith(PREFIX + "/")):
        return None
    if error.code == 404:
        return error_response(404, f"There is no {request.path} in this API.", code="not_found")
    if error.code == 405:
        return _http_error(error)
    return None  # a redirect to the URL with its slash
