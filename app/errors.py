"""Errors callers get: domain errors and HTTP errors alike, in the envelope of their door.

The envelope is OpenAI's, ``{"error": {"message", "type", "code", "param"}}``, unless the
request came in by a door that registered its own for its paths (Anthropic's Messages
API: ``{"type": "error", "error": {...}}``); errors raised before any view (an unknown
path, a body too large, a rate limit) are rendered by the door whose path they hit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, current_app, has_request_context, request
from werkzeug.exceptions import HTTPException

from app.encoding import dumps
from app.observability.trace import current_trace

log = logging.getLogger(__name__)


class APIError(Exception):
    """Base of every error a caller can receive; subclasses set status, type and code."""

    status: int = 500
    type: str = "api_error"
    code: str | None = None
    retryable: bool = False
    default_message: str = "The server had an error while processing the request."

    def __init__(
        self, message: str | None = None, *, param: str | None = None, code: str | None = None
    ) -> None:
        self.message = message or self.default_message
        self.param = param
        if code is not None:
            self.code = code
        super().__init__(self.message)

    def to_envelope(self) -> dict[str, Any]:
        """Render as the contract's error envelope."""
        return envelope(self.message, self.type, self.code, self.param)


class InvalidRequest(APIError):
    """The body or a parameter breaks the contract (section 2 and the limits of section 8)."""

    status = 400
    type = "invalid_request_error"
    default_message = "The request is malformed."


def envelope(message: str, type_: str, code: str | None, param: str | None) -> dict[str, Any]:
    """Build ``{"error": {"message", "type", "code", "param"}}``."""
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


# A door's rendering of an error: the status and the body it answers with; None leaves
# the error to the next door registered for the path (paths two doors share: /v1/models).
Envelope = Callable[[APIError], tuple[int, dict[str, Any]] | None]
ENVELOPES = "gateway.error_envelopes"


def register_envelope(app: Flask, path_prefix: str, render: Envelope) -> None:
    """Render the errors of requests to paths under ``path_prefix`` with ``render``."""
    app.extensions.setdefault(ENVELOPES, []).append((path_prefix, render))


def rendered(error: APIError) -> tuple[int, dict[str, Any]]:
    """Return the status and body of ``error`` in the envelope of the request's door."""
    if has_request_context():
        for path_prefix, render in current_app.extensions.get(ENVELOPES, ()):
            if request.path.startswith(path_prefix) and (answer := render(error)) is not None:
                return answer
    return error.status, error.to_envelope()


def error_response(error: APIError, headers: dict[str, str] | None = None) -> Response:
    """Build a JSON response carrying ``error``'s envelope and status, as its door says."""
    current_trace().error_code = error.code
    status, body = rendered(error)
    response = Response(dumps(body), status, mimetype="application/json")
    if headers:
        response.headers.update(headers)
    return response


# Types and codes for errors raised by the framework itself rather than by our code.
HTTP_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


def http_error_to_api_error(exc: HTTPException) -> APIError:
    """Translate a werkzeug HTTPException (404, 405, 413, ...) into an APIError."""
    status = exc.code or 500
    type_, code = HTTP_ERRORS.get(status, ("api_error", "server_error"))
    error = APIError(exc.description or exc.name, code=code)
    error.status, error.type = status, type_
    return error


def handle_api_error(error: APIError) -> Response:
    """Render a domain error."""
    return error_response(error)


def handle_http_exception(exc: HTTPException) -> Response:
    """Render a framework error (unknown path, wrong method, body too large, ...)."""
    headers = {}
    if exc.code == 405 and exc.valid_methods:
        headers["Allow"] = ", ".join(exc.valid_methods)
    return error_response(http_error_to_api_error(exc), headers)


def handle_unexpected_error(exc: Exception) -> Response:
    """Log an unexpected failure and answer 500 in the envelope, revealing nothing of it."""
    log.exception("unhandled error while serving a request")
    return error_response(APIError(code="server_error"))


def register_errorhandlers(app: Flask) -> None:
    """Route every error a view can raise through the envelope."""
    app.register_error_handler(APIError, handle_api_error)
    app.register_error_handler(HTTPException, handle_http_exception)
    app.register_error_handler(Exception, handle_unexpected_error)
