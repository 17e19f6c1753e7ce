"""A statement: an organisation's chained ledger entries over a period, and where they leave it.

The entries are those from the account's first entry stamped at or after the period's
start up to, not including, its first entry stamped at or after the period's end, in
the order of their ids (the chain's): statements of consecutive periods therefore meet
exactly, the closing head of one the opening head of the next. Each entry carries what
its digest covers (app.credits.chain), amounts in the ledger's units, its time in
microseconds, and its previous and own digests. The opening balance and head are those
the entry before the first left (0 and GENESIS for none); the closing ones those the
last entry left (the opening ones if the period has none).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from app.credits.chain import FORMAT as CHAIN_FORMAT
from app.credits.chain import GENESIS, epoch_micros
from app.credits.chain_audit import CHAINED_COLUMNS
from app.credits.models import Account, LedgerEntry
from app.extensions import db
from app.ledger_statements.periods import Period, months_between
from app.ledger_statements.signing import current_signing_key, signed
from app.money import UNITS_PER_USD, money_units

FORMAT = "ledger-statement-v1"


def iso_time(moment: datetime) -> str:
    """Write ``moment`` as ISO 8601 in UTC, ``Z``-suffixed."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def organisation(account_id: int) -> Account:
    """Return the organisation (account) ``account_id``, which a caller's key names."""
    account = db.session.get(Account, account_id)
    if account is None:
        raise LookupError(f"no account {account_id}")
    return account


def statement_periods(account: Account, now: datetime) -> list[dict[str, Any]]:
    """Return the months the account has statements for, newest first, as the API lists them."""
    return [
        {
            "period": month.label,
            "from": iso_time(month.start),
            "to": iso_time(month.end),
            "complete": month.complete(now),
        }
        for month in months_between(account.created_at, now)
    ]


def signed_statement(*, account: Account, period: Period, now: datetime) -> dict[str, Any]:
    """Return the account's statement of ``period``, signed. :raise SigningKeyMissing."""
    key = current_signing_key()
    return signed(build_statement(account=account, period=period, now=now), key)


def build_statement(*, account: Account, period: Period, now: datetime) -> dict[str, Any]:
    """Return the account's statement of ``period`` as read at ``now``, not signed."""
    first = _first_entry_from(account.id, period.start)
    beyond = _first_entry_from(account.id, period.end)
    opening_hash, opening_units = _left_before(account.id, first)
    entries = [_entry(row) for row in _entries(account.id, first, beyond)]
    closing = entries[-1] if entries else None
    statement = {
        "format": FORMAT,
        "chain_format": CHAIN_FORMAT,
        "account_id": account.id,
        "organisation": account.name,
        "period": period.label,
        "from": iso_time(period.start),
        "to": iso_time(period.end),
        "complete": period.complete(now),
        "issued_at": iso_time(now),
        "units_per_usd": UNITS_PER_USD,
        "opening_balance_units": opening_units,
        "opening_hash": opening_hash,
        "closing_balance_units": closing["balance_after_units"] if closing else opening_units,
        "closing_hash": closing["entry_hash"] if closing else opening_hash,
        "entries": entries,
    }
    db.session.commit()
    return statement


def _first_entry_from(account_id: int, moment: datetime) -> int | None:
    """Return the id of the account's first entry stamped at or after ``moment``, or None."""
    return db.session.scalar(
        select(func.min(LedgerEntry.id)).where(
            LedgerEntry.account_id == account_id, LedgerEntry.created_at >= moment
        )
    )


def _left_before(account_id: int, entry_id: int | None) -> tuple[str, int]:
    """Return the digest and balance (units) the entry before ``entry_id`` left.

    None stands for after the account's last entry; GENESIS and 0 if there is none before.
    """
    query = select(LedgerEntry.entry_hash, LedgerEntry.balance_after).where(
        LedgerEntry.account_id == account_id
    )
    if entry_id is not None:
        query = query.where(LedgerEntry.id < entry_id)
    row = db.session.execute(query.order_by(LedgerEntry.id.desc()).limit(1)).first()
    if row is None:
        return GENESIS, 0
    return row.entry_hash, money_units(row.balance_after)


def _entries(account_id: int, first: int | None, beyond: int | None) -> list[Any]:
    """Return the account's entries from id ``first`` up to, not including, ``beyond``."""
    if first is None:
        return []
    query = select(*CHAINED_COLUMNS).where(
        LedgerEntry.account_id == account_id, LedgerEntry.id >= first
    )
    if beyond is not None:
        query = query.where(LedgerEntry.id < beyond)
    return list(db.session.execute(query.order_by(LedgerEntry.id)).all())


def _entry(row: Any) -> dict[str, Any]:
    """Return an entry as a statement lists it: what its digest covers, and its digests."""
    return {
        "id": row.id,
        "account_id": row.account_id,
        "kind": row.kind,
        "amount_units": money_units(row.amount),
        "balance_after_units": money_units(row.balance_after),
        "generation_id": row.generation_id,
        "reference": row.idempotency_key,
        "time_micros": epoch_micros(row.created_at),
        "previous_hash": row.previous_hash,
        "entry_hash": row.entry_hash,
    }
