"""Decode a JSON request body, refusing other media types and malformed JSON in the envelope."""

from __future__ import annotations

from typing import Any

from flask import Request

from app.encoding import loads
from app.errors import APIError, InvalidRequest


class UnsupportedMediaType(APIError):
    """The body is not JSON (415)."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"
    default_message = "The request body must be JSON, sent with 'Content-Type: application/json'."


# curl -d sends this type unless told otherwise; a body that parses as JSON is taken as JSON.
FORM_MIMETYPE = "application/x-www-form-urlencoded"


def json_body(request: Request) -> Any:
    """Return the decoded body of ``request``.

    A missing Content-Type is read as JSON, as the OpenAI API does, and so is curl's
    default form type when the body parses as JSON; any other non-JSON type is refused.

    :raise UnsupportedMediaType: the body is declared as something other than JSON.
    :raise InvalidRequest: the body is not valid JSON.
    """
    if request.mimetype == FORM_MIMETYPE:
        return _form_typed_json(request)
    if request.mimetype and not request.is_json:
        raise UnsupportedMediaType()
    try:
        return loads(request.get_data(cache=False))
    except ValueError:
        raise InvalidRequest(
            "We could not parse the JSON body of your request. Send a valid JSON object.",
            code="invalid_json",
        ) from None


def _form_typed_json(request: Request) -> Any:
    try:
        return loads(request.get_data(cache=False))
    except ValueError:
        raise UnsupportedMediaType() from None
