"""The ledger's hash chain: each entry's digest, the same in SQL on either database and here.

Each entry of an account carries ``entry_hash``, the SHA-256 of its canonical text, which
ends with ``previous_hash``, the digest of the account's entry before it (GENESIS for the
first); the account's row keeps the last digest, ``ledger_head``, written by the UPDATE
that changes its balance. Changing, removing or reordering an entry, or a balance,
breaks the chain where it was done (app.credits.chain_audit).

The canonical text (docs/concepts/ledger-chain.md), version 1, fields joined by ``|``::

    ledger-v1|ID|ACCOUNT|KIND|AMOUNT|BALANCE_AFTER|GENERATION|REFERENCE|MICROS|PREVIOUS

integers in decimal (amounts in the ledger's units of MONEY_QUANTUM, the time in
microseconds since the Unix epoch, UTC), each text that may hold anything written as
``LENGTH:TEXT`` (``-`` for none), so that no two entries share a text; its UTF-8 bytes
are hashed, the digest written as 64 lower-case hex digits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, String, case, cast, func, literal_column
from sqlalchemy.sql.elements import Null

from app.database import sha256_hex
from app.money import money_units

FORMAT = "ledger-v1"
# The previous digest of an account's first entry, and the head of an account without any.
GENESIS = "0" * 64
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_micros(moment: datetime) -> int:
    """Return ``moment`` (aware, or naive UTC) as whole microseconds since the Unix epoch."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _text_field(value: str | None) -> str:
    return "-" if value is None else f"{len(value)}:{value}"


@dataclass(frozen=True)
class ChainedFields:
    """What an entry's digest covers, as the ledger stores it."""

    entry_id: int
    account_id: int
    kind: str
    amount: Decimal
    balance_after: Decimal
    generation_id: str | None
    reference: str | None
    created_at: datetime
    previous_hash: str

    def text(self) -> str:
        """Return the entry's canonical text."""
        return "|".join(
            (
                FORMAT,
                str(self.entry_id),
                str(self.account_id),
                self.kind,
                str(money_units(self.amount)),
                str(money_units(self.balance_after)),
                _text_field(self.generation_id),
                _text_field(self.reference),
                str(epoch_micros(self.created_at)),
                self.previous_hash,
            )
        )

    def digest(self) -> str:
        """Return the entry's digest: the SHA-256 of its canonical text, in hex."""
        return hashlib.sha256(self.text().encode()).hexdigest()


def _as_text(value: Any) -> ColumnElement[str]:
    return cast(value, String())


def _sql_text_field(value: Any) -> ColumnElement[str]:
    if isinstance(value, Null):
        return literal_column("'-'", String())
    text = _as_text(value)
    return case(
        (value.is_(None), literal_column("'-'", String())),
        else_=_as_text(func.length(text)) + literal_column("':'", String()) + text,
    )


def sql_digest(
    entry_id: Any,
    account_id: Any,
    kind: Any,
    amount_units: Any,
    balance_units: Any,
    generation_id: Any,
    reference: Any,
    micros: Any,
    previous_hash: Any,
) -> ColumnElement[str]:
    """Return the SQL computing ChainedFields.digest from these expressions (amounts in units)."""
    bar = literal_column("'|'", String())
    text = literal_column(f"'{FORMAT}'", String())
    for part in (
        _as_text(entry_id),
        _as_text(account_id),
        _as_text(kind),
        _as_text(amount_units),
        _as_text(balance_units),
        _sql_text_field(generation_id),
        _sql_text_field(reference),
        _as_text(micros),
        _as_text(previous_hash),
    ):
        text = text + bar + part
    return sha256_hex(text)
