"""A hold's time: renewed while its stream runs, released when its worker died, or voided.

A hold expires ``ttl_seconds`` after it is placed, unless its stream pushes it forward
(extend_holds) and keeps what it delivered (record_progress). A hold past its expiry is
released (release_expired_holds: by the sweeper, and by a hold it stands in the way of),
unless its stream recorded progress, which it is settled at (expired_holds_with_progress).
A hold whose request was given up for another is voided, so that it never charges
(void_hold).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from app.credits.balances import HeldCredit
from app.credits.models import EXPIRED, OPEN, SETTLED, VOIDED, Hold
from app.credits.sql import expiry as expiry_sql
from app.credits.sql import guards
from app.database import execute_alone, execute_on_driver, utcnow, write_transaction
from app.extensions import db

# How many holds one renewal statement names.
EXTEND_BATCH = 500


def extend_holds(hold_ids: Sequence[str], *, ttl_seconds: int) -> int:
    """Push the expiry of the open holds among ``hold_ids`` forward; return how many."""
    expires_at = utcnow() + timedelta(seconds=ttl_seconds)

    def extend(connection: Connection) -> int:
        extended = 0
        for start in range(0, len(hold_ids), EXTEND_BATCH):
            batch = list(hold_ids[start : start + EXTEND_BATCH])
            parameters = {"hold_ids": batch, "expires_at": expires_at}
            extended += connection.execute(expiry_sql.EXTEND_HOLDS, parameters).rowcount
        return extended

    return write_transaction(extend)


def record_progress(progress_by_hold: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Keep each open hold's ``progress``: what its stream delivered, priced if it dies.

    One statement for all of them, in one transaction.
    """
    if not progress_by_hold:
        return
    rows = [{"hold_id": hold_id, "progress": progress} for hold_id, progress in progress_by_hold]
    write_transaction(lambda connection: connection.execute(expiry_sql.RECORD_PROGRESS, rows))


def record_first_progress(hold_id: str, progress: dict[str, Any]) -> None:
    """Keep a stream's progress before its first output goes out: one row, on the driver.

    record_progress's UPDATE, handed to the driver: SQLAlchemy's execution of it (its
    many-rows form, its cache lookup, its result) cost more than the statement, once
    for every stream. On PostgreSQL it runs alone, prepared, on a kept connection.
    """
    parameters = {"hold_id": hold_id, "progress": progress}
    write_transaction(
        lambda connection: execute_on_driver(connection, expiry_sql.RECORD_PROGRESS, parameters),
        alone=lambda: len(
            execute_alone(expiry_sql.RECORD_PROGRESS_ALONE, parameters, prepared=True)
        ),
    )


def expired_holds_with_progress(*, limit: int = 500) -> list[tuple[HeldCredit, dict[str, Any]]]:
    """Return open holds past their expiry whose stream recorded progress, with it.

    Their worker died while they streamed: they are settled at their progress
    (``app.generations.lifecycle.settle_interrupted``), not released.
    """
    rows = db.session.execute(
        select(*_HELD_CREDIT, Hold.progress)
        .where(Hold.status == OPEN, Hold.expires_at < utcnow(), Hold.progress.is_not(None))
        .limit(limit)
    ).all()
    db.session.commit()
    return [(HeldCredit(*row[:-1]), row.progress) for row in rows]


# A hold's columns, in HeldCredit's order.
_HELD_CREDIT = (Hold.id, Hold.account_id, Hold.amount, Hold.api_key_id)


def release_expired_holds(*, account_id: int | None = None, limit: int = 500) -> int:
    """Release open holds past their expiry (their worker died); return how many.

    A hold whose stream recorded progress is left to be settled at it (see
    ``expired_holds_with_progress``).
    """
    query = select(*_HELD_CREDIT).where(
        Hold.status == OPEN, Hold.expires_at < utcnow(), Hold.progress.is_(None)
    )
    if account_id is not None:
        query = query.where(Hold.account_id == account_id)
    expired = db.session.execute(query.limit(limit)).all()
    db.session.commit()
    released = 0
    for row in expired:
        held = HeldCredit(*row)
        released += write_transaction(lambda connection, held=held: _expire(connection, held))
    return released


def _expire(connection: Connection, hold: HeldCredit) -> int:
    closed = execute_on_driver(
        connection, guards.CLOSE_HOLD, {"hold_id": hold.id, "status": EXPIRED}
    )
    if closed != 1:
        return 0
    execute_on_driver(
        connection,
        guards.DEBIT,
        {"account_id": hold.account_id, "charge": 0, "released": hold.amount},
    )
    if hold.key_id is not None:
        released = {"hold_id": hold.id, "key_id": hold.key_id, "amount": hold.amount}
        execute_on_driver(connection, expiry_sql.RELEASE_ON_KEY, released)
        execute_on_driver(connection, expiry_sql.RELEASE_ON_MEMBER, released)
    return 1


def void_hold(connection: Connection, *, hold_id: str, account_id: int, seen: str | None) -> bool:
    """Make sure the hold ``hold_id``, found ``seen`` (None: not placed), never charges.

    For a request given up for another (a retry took its Idempotency-Key over): its
    worker may only have stalled past the hold's TTL, and run on. A hold not placed is
    placed voided, so that its request cannot place it (place_hold raises HoldVoided);
    an expired one is voided, so that a settlement that comes after all charges nothing.
    Return False if the hold is no longer as it was seen (its request placed it, or
    settled it, since): the request is alive. In the caller's transaction.
    """
    if seen is None:
        now = utcnow()
        dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
        placed = (
            dialect.insert(Hold)
            .values(
                id=hold_id,
                account_id=account_id,
                amount=Decimal(0),
                status=VOIDED,
                created_at=now,
                expires_at=now,
            )
            .on_conflict_do_nothing(index_elements=[Hold.id])
            # Its row, not its count: a driver need not count an INSERT's rows.
            .returning(Hold.id)
        )
        return connection.execute(placed).first() is not None
    if seen == EXPIRED:
        voided = update(Hold).where(Hold.id == hold_id, Hold.status == EXPIRED)
        return connection.execute(voided.values(status=VOIDED)).rowcount == 1
    return seen in (SETTLED, VOIDED)
