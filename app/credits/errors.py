"""What can go wrong with money."""

from __future__ import annotations

from app.errors import APIError


class InsufficientCredits(APIError):
    """The available balance cannot cover the request's worst-case cost (402)."""

    status = 402
    type = "insufficient_quota"
    code = "insufficient_quota"
    default_message = "Insufficient credits: add credits to the account to continue."


class GrantOutOfRange(ValueError):
    """A grant the ledger cannot hold: not positive, finer than its precision, or too large."""


class IdempotencyConflict(ValueError):
    """An idempotency key was reused for a different operation."""


class AlreadyRecorded(Exception):
    """A settlement's record was written before, by a settlement of the same hold.

    A generation is recorded once. On a table partitioned by time (PostgreSQL's
    generations), a record's id alone is no unique key; a settlement of a hold that was
    no longer open looks for its record first, and writes nothing if it is there.
    """


class HoldVoided(Exception):
    """A hold's id was voided before its request placed it: the request was given up for another.

    A retry took over the Idempotency-Key of a request that seemed dead (ledger.void_hold).
    """
