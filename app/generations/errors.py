"""Requests the model cannot serve as asked."""

from __future__ import annotations

from app.errors import APIError


class UnsupportedContent(APIError):
    """The request carries input the model cannot take, such as images on a text model."""

    status = 400
    type = "invalid_request_error"
    code = "unsupported_content"


class ContextLengthExceeded(APIError):
    """The prompt alone is longer than the model's context window.

    ``tokens`` is the count that passed ``limit`` (counting stops there), for the doors
    whose clients read the numbers from the message (Claude Code compacts on them).
    """

    status = 400
    type = "invalid_request_error"
    code = "context_length_exceeded"

    def __init__(
        self, message: str, *, param: str | None = None, tokens: int = 0, limit: int = 0
    ) -> None:
        super().__init__(message, param=param)
        self.tokens, self.limit = tokens, limit


class OutputLimitExceeded(APIError):
    """The caller asked for more output tokens than the model can produce."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class UnpricedSurcharge(APIError):
    """A service tier or hosted tool the model's catalog entry does not price was asked for."""

    status = 400
    type = "invalid_request_error"
    code = "unsupported_parameter"


class GenerationNotFound(APIError):
    """No generation of the caller's account has the id asked for (404)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class UncountableContent(APIError):
    """A request passed through carries content whose tokens the gateway cannot bound.

    Such content is never sent: what reaches an upstream is what the hold counted.
    """

    status = 400
    type = "invalid_request_error"
    code = "uncountable_content"
