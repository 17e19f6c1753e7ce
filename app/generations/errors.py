"""Requests the model cannot serve as asked."""

from __future__ import annotations

from app.errors import APIError


class UnsupportedContent(APIError):
    """The request carries input the model cannot take, such as images on a text model."""

    status = 400
    type = "invalid_request_error"
    code = "unsupported_content"


class ContextLengthExceeded(APIError):
    """The prompt alone is longer than the model's context window."""

    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"


class OutputLimitExceeded(APIError):
    """The caller asked for more output tokens than the model can produce."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class GenerationNotFound(APIError):
    """No generation of the caller's account has the id asked for (404)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"
