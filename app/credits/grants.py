"""Grants: credit added to an account, and a payment's credit taken back.

A grant by an operator or a test (grant_credits) commits alone and is applied once per
idempotency key; one that comes with a change of state of its own (an order paid, a code
redeemed: grant_within, take_back_within) is written in the caller's transaction. Each is
one chained entry (app.credits.entries), and no balance passes MAX_MONEY.
"""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.credits.entries import append_entry
from app.credits.errors import GrantOutOfRange, IdempotencyConflict
from app.credits.models import GRANT, TAKE_BACK, LedgerEntry
from app.credits.sql import entries as entry_sql
from app.extensions import db
from app.money import MAX_MONEY, MONEY_QUANTUM, exact_money


def grant_credits(
    *,
    account_id: int,
    amount: Decimal,
    idempotency_key: str | None = None,
    description: str | None = None,
    granted_by: str | None = None,
) -> tuple[LedgerEntry, bool]:
    """Add ``amount`` USD to the balance; return the entry and whether it is new.

    A grant repeated with the same idempotency key is applied once: the first entry is
    returned. ``granted_by`` (an operator's email) is recorded in the description as
    ``granted by EMAIL: description``. :raise IdempotencyConflict: the key was used for
    a different amount.
    """
    _refuse_out_of_range(amount)
    if granted_by:
        description = f"granted by {granted_by}" + (f": {description}" if description else "")
        description = description[:255]
    if idempotency_key and (entry := _grant_by_key(account_id, idempotency_key)):
        return _same_grant_or_raise(entry, amount), False
    try:
        try:
            _append_grant(db.session.connection(), account_id, amount, idempotency_key, description)
        except GrantOutOfRange:
            db.session.rollback()
            raise
        # The account's row is locked (or SQLite's write lock held): its last entry is this one.
        entry = db.session.scalar(
            select(LedgerEntry)
            .where(LedgerEntry.account_id == account_id)
            .order_by(LedgerEntry.id.desc())
            .limit(1)
        )
        db.session.commit()
    except IntegrityError:
        # A concurrent grant with the same key won the race: return its entry.
        db.session.rollback()
        if idempotency_key and (entry := _grant_by_key(account_id, idempotency_key)):
            return _same_grant_or_raise(entry, amount), False
        raise
    return entry, True


def _refuse_out_of_range(amount: Decimal) -> None:
    if amount <= 0 or amount > MAX_MONEY or not exact_money(amount):
        raise GrantOutOfRange(
            f"a grant must be a positive amount of whole {MONEY_QUANTUM} USD, "
            f"at most {MAX_MONEY}: {amount}"
        )


def grant_within(
    connection: Connection,
    *,
    account_id: int,
    amount: Decimal,
    idempotency_key: str,
    description: str,
) -> None:
    """Add ``amount`` USD to the balance, in the caller's transaction on ``connection``.

    For credit that comes with a change of state of its own (an order paid, a code
    redeemed), which must commit with it or not at all. ``idempotency_key`` names what
    the credit came from: the ledger's unique key refuses a second grant of it
    (IntegrityError), whatever the caller's own guard missed.
    """
    _refuse_out_of_range(amount)
    _append_grant(connection, account_id, amount, idempotency_key, description)


def _append_grant(
    connection: Connection,
    account_id: int,
    amount: Decimal,
    reference: str | None,
    note: str | None,
) -> None:
    """Chain a grant's entry and raise the balance, unless it would pass MAX_MONEY."""
    chained = append_entry(
        connection,
        account_id=account_id,
        kind=GRANT,
        amount=amount,
        reference=reference,
        note=note,
        guard=entry_sql.WITHIN_MAX_BALANCE,
    )
    if not chained:
        raise GrantOutOfRange(f"the balance would pass the most the ledger holds: {MAX_MONEY} USD")


def take_back_within(
    connection: Connection,
    *,
    account_id: int,
    amount: Decimal,
    idempotency_key: str,
    description: str,
) -> None:
    """Take ``amount`` USD of a payment's credit back (a refund, a dispute), in one transaction.

    The caller's, on ``connection``, with the change of state that takes it back.
    Never lowered to what is left: credit already spent is not taken from past charges,
    and the balance may go below zero, which refuses every new hold until it is paid back.
    """
    _refuse_out_of_range(amount)
    append_entry(
        connection,
        account_id=account_id,
        kind=TAKE_BACK,
        amount=-amount,
        reference=idempotency_key,
        note=description,
    )


def _grant_by_key(account_id: int, idempotency_key: str) -> LedgerEntry | None:
    return db.session.scalar(
        select(LedgerEntry).where(
            LedgerEntry.account_id == account_id,
            LedgerEntry.idempotency_key == idempotency_key,
        )
    )


def _same_grant_or_raise(entry: LedgerEntry, amount: Decimal) -> LedgerEntry:
    if entry.kind != GRANT or entry.amount != amount:
        raise IdempotencyConflict(
            f"idempotency key {entry.idempotency_key!r} was used for a grant of {entry.amount}"
        )
    return entry
