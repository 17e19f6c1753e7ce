"""Google's error envelope, ``{"error": {"code", "message", "status"}}``, and statuses.

Google's clients raise by the HTTP code and show ``message``; ``status`` is the canonical
gRPC name of the code. Each of the gateway's errors is answered with the code Google's API
gives the same condition: an unknown model is 404 ``NOT_FOUND``, a refused key 401
``UNAUTHENTICATED``. Exhausted credits are 402 (Google has no code for them) with status
``RESOURCE_EXHAUSTED``: Gemini CLI retries a 429 for minutes, but shows a 402's message at
once and stops, and so do the SDKs (a ``ClientError``).
"""

from __future__ import annotations

from typing import Any

from flask import request

from app.auth.errors import InvalidKey
from app.catalog.errors import UnknownModel
from app.errors import APIError
from app.providers.errors import UpstreamTimeout, UpstreamUnavailable

# The Gemini door reads a key where Google's clients send it.
KEY_HEADERS = "'x-goog-api-key: <key>', '?key=<key>' or 'Authorization: Bearer <key>'"
# Google's canonical status for each HTTP code the gateway answers with.
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    402: "RESOURCE_EXHAUSTED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "UNIMPLEMENTED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
INTERNAL = "INTERNAL"
# Marks of a request from Google's clients on paths shared with the other doors (/v1/models).
GOOGLE_HEADERS = ("x-goog-api-key", "x-goog-api-client")


def status_of(error: APIError) -> int:
    """Return the HTTP code Google's API answers ``error``'s condition with."""
    if isinstance(error, UnknownModel):
        return 404
    if isinstance(error, UpstreamUnavailable):
        return 503
    if isinstance(error, UpstreamTimeout):
        return 504
    return error.status


def message_of(error: APIError) -> str:
    """Return ``error``'s message; a refused key is asked for where this door reads one."""
    if isinstance(error, InvalidKey):
        return error.worded(KEY_HEADERS)
    return error.message


def error_body(error: APIError, code: int | None = None) -> dict[str, Any]:
    """Return ``error`` in Google's envelope."""
    code = code or status_of(error)
    status = STATUSES.get(code, INTERNAL)
    return {"error": {"code": code, "message": message_of(error), "status": status}}


def render(error: APIError) -> tuple[int, dict[str, Any]]:
    """Render an error of the Gemini door: its code and Google's envelope."""
    code = status_of(error)
    return code, error_body(error, code)


def from_google_client() -> bool:
    """Tell whether the request comes from Google's clients: a key where only they send it."""
    return any(name in request.headers for name in GOOGLE_HEADERS) or "key" in request.args


def is_gemini_call() -> bool:
    """Tell whether a request under /v1/models is one of this door's (``model:method``)."""
    return request.method == "POST" and ":" in request.path.rpartition("/")[2]


def render_for_google_callers(error: APIError) -> tuple[int, dict[str, Any]] | None:
    """Render in Google's envelope on /v1/models for Google's clients; None for the others."""
    if is_gemini_call() or from_google_client():
        return render(error)
    return None
