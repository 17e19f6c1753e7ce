"""Decode a JSON request body, refusing other media types, malformed JSON and deep nesting.

Nesting is bounded at parse time, once for every body, so that no code further on (the
schema, the built-in model, the adapters) can recurse into a RecursionError.
"""

from __future__ import annotations

from typing import Any

from flask import Request
from flask import request as current_request

from app.encoding import loads
from app.errors import APIError, InvalidRequest

MAX_NESTING_DEPTH = 64


class UnsupportedMediaType(APIError):
    """The body is not JSON (415)."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"
    default_message = "The request body must be JSON, sent with 'Content-Type: application/json'."


# curl -d sends this type unless told otherwise; a body that parses as JSON is taken as JSON.
FORM_MIMETYPE = "application/x-www-form-urlencoded"


def json_body() -> Any:
    """Return the decoded body of the request being served.

    A missing Content-Type is read as JSON, as the OpenAI API does, and so is curl's
    default form type when the body parses as JSON; any other non-JSON type is refused.

    :raise UnsupportedMediaType: the body is declared as something other than JSON.
    :raise InvalidRequest: the body is not valid JSON.
    """
    # The request itself, read once: every attribute read through Flask's proxy looks the
    # request's context up again, several times the cost of the read.
    request: Request = current_request._get_current_object()
    mimetype = request.mimetype
    if mimetype == FORM_MIMETYPE:
        body = _form_typed_json(request)
    elif mimetype and not request.is_json:
        raise UnsupportedMediaType()
    else:
        body = _declared_json(request)
    if nesting_depth_exceeds(body, MAX_NESTING_DEPTH):
        raise InvalidRequest(
            f"The JSON body is nested more than {MAX_NESTING_DEPTH} levels deep.",
            code="invalid_json",
        )
    return body


def _declared_json(request: Request) -> Any:
    try:
        return loads(request.get_data(cache=False))
    except ValueError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request. Send a valid JSON object.",
            code="invalid_json",
        ) from None


def nesting_depth_exceeds(value: Any, limit: int) -> bool:
    """Tell whether arrays and objects in ``value`` nest more than ``limit`` levels deep.

    It walks level by level, never recursing, and stops at the first level past ``limit``.
    """
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _form_typed_json(request: Request) -> Any:
    try:
        return loads(request.get_data(cache=False))
    except ValueError:
        raise UnsupportedMediaType() from None
