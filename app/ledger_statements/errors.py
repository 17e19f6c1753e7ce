"""What can go wrong with a statement: a period that is none, or no key to sign it with."""

from __future__ import annotations

from app.errors import APIError, InvalidRequest


class InvalidPeriod(InvalidRequest):
    """The period is not ``YYYY-MM`` nor ``YYYY-MM-DD..YYYY-MM-DD``, or has not begun (400)."""

    code = "invalid_period"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="period")


class SigningKeyMissing(APIError):
    """Production without LEDGER_SIGNING_KEY: statements are refused, never signed ad hoc (503)."""

    status = 503
    type = "api_error"
    code = "statements_unavailable"
    default_message = (
        "Statements are not available: the operator has not set LEDGER_SIGNING_KEY, "
        "the key that signs them."
    )
