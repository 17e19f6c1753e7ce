"""What can go wrong with money."""

from __future__ import annotations

from app.errors import APIError


class InsufficientCredits(APIError):
    """The available balance cannot cover the request's worst-case cost (402)."""

    status = 402
    type = "insufficient_quota"
    code = "insufficient_quota"
    default_message = "Insufficient credits: add credits to the account to continue."


class IdempotencyConflict(ValueError):
    """An idempotency key was reused for a different operation."""
