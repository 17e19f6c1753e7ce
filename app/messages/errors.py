"""Anthropic's error envelope, ``{"type": "error", "error": {"type", "message"}}``, and statuses.

The Anthropic SDKs pick the exception they raise by status and read ``error.type``; Claude
Code decides by both whether to retry, compact or give up. So each of the gateway's
errors is answered with the status and type Anthropic's API gives the same condition: an
unknown model is 404 ``not_found_error`` (Claude Code then stops at once rather than
retrying for minutes), a model every route of which is overloaded 529
``overloaded_error``, exhausted credits 402 ``billing_error``.
"""

from __future__ import annotations

from typing import Any

from flask import request

from app.auth.errors import InvalidKey
from app.catalog.errors import UnknownModel
from app.errors import APIError
from app.generations.errors import ContextLengthExceeded
from app.providers.errors import UpstreamTimeout, UpstreamUnavailable

OVERLOADED = 529
# The Messages door reads a key from either header: Anthropic's SDKs send x-api-key, or a
# bearer for an auth token (Claude Code's ANTHROPIC_AUTH_TOKEN).
KEY_HEADERS = "'x-api-key: <key>' or 'Authorization: Bearer <key>'"
# Anthropic's error type for each status the gateway answers with.
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    OVERLOADED: "overloaded_error",
}
API_ERROR = "api_error"


def status_of(error: APIError) -> int:
    """Return the status Anthropic's API answers ``error``'s condition with."""
    if isinstance(error, UnknownModel):
        return 404
    if isinstance(error, UpstreamUnavailable):
        return OVERLOADED
    if isinstance(error, UpstreamTimeout):
        return 504
    return error.status


def message_of(error: APIError) -> str:
    """Return ``error``'s message, in Anthropic's words where clients match them.

    Claude Code compacts the conversation when a prompt is too long, recognising it by
    Anthropic's sentence and numbers. A refused key is asked for in either header this
    door reads.
    """
    if isinstance(error, ContextLengthExceeded) and error.limit:
        return f"prompt is too long: {error.tokens} tokens > {error.limit} maximum"
    if isinstance(error, InvalidKey):
        return error.worded(KEY_HEADERS)
    return error.message


def error_body(error: APIError, status: int | None = None) -> dict[str, Any]:
    """Return ``error`` in Anthropic's envelope."""
    kind = TYPES.get(status or status_of(error), API_ERROR)
    return {"type": "error", "error": {"type": kind, "message": message_of(error)}}


def render(error: APIError) -> tuple[int, dict[str, Any]]:
    """Render an error of the Messages door: its status and Anthropic's envelope."""
    status = status_of(error)
    return status, error_body(error, status)


def render_for_anthropic_callers(error: APIError) -> tuple[int, dict[str, Any]]:
    """Render in Anthropic's envelope for a request that says its API version, else OpenAI's.

    The model list is shared by both doors; an Anthropic SDK sends ``anthropic-version``.
    """
    if "anthropic-version" in request.headers:
        return render(error)
    return error.status, error.to_envelope()
