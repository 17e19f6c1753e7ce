"""What can go wrong with money."""

from __future__ import annotations

from decimal import Decimal

from app.errors import APIError


class InsufficientCredits(APIError):
    """The available balance cannot cover the request's worst-case cost (402).

    When a smaller output cap would fit, the refusal says how small, by the name of the
    field the caller sets it with. That name is the door's (``max_output_tokens`` on
    Responses, ``max_tokens`` on Messages): the core raises the refusal with ``max_tokens``
    and the door that took the request renames it (``name_output_field``).
    """

    status = 402
    type = "insufficient_quota"
    code = "insufficient_quota"
    default_message = "Insufficient credits: add credits to the account to continue."

    def __init__(
        self,
        message: str | None = None,
        *,
        affordable: int = 0,
        then: str = "",
        output_field: str = "max_tokens",
    ) -> None:
        self.reason, self.affordable, self.then = message, affordable, then
        super().__init__(self._worded(output_field))

    def name_output_field(self, output_field: str) -> None:
        """Say the cap that would fit as the field ``output_field`` of the caller's door."""
        self.message = self._worded(output_field)
        self.args = (self.message,)

    def _worded(self, output_field: str) -> str | None:
        if self.reason is None or self.affordable <= 0:
            return self.reason
        return f"{self.reason} Set {output_field} to at most {self.affordable}, {self.then}"


class AccountInDebt(InsufficientCredits):
    """The balance is below zero: a payment was taken back after its credit was spent (402).

    Every request is refused until credits added bring the balance back to zero or above.
    """

    code = "account_in_debt"

    def __init__(self, balance: Decimal) -> None:
        super().__init__(
            f"The account is in debt (balance ${balance:f}): a payment was refunded or "
            "disputed after its credits were spent. Add credits to continue."
        )


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

    A retry took over the Idempotency-Key of a request that seemed dead (expiry.void_hold).
    """
