"""A settlement is never lost to a database error that another try can mend, nor doubled."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError, OperationalError

from app.credits import balances, expiry, holds, settlement
from app.credits.errors import AlreadyRecorded
from app.credits.models import OPEN, SETTLED, Account, Hold, LedgerEntry
from app.database import utcnow
from app.extensions import db
from app.generations.models import Generation
from tests.factories import AccountFactory

MINUTE = timedelta(minutes=1)
RECORD_DEFAULTS = {
    column.name: column.default.arg
    for column in Generation.__table__.columns
    if column.default is not None and not callable(column.default.arg)
}


def lost_connection() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch):
    monkeypatch.setattr(settlement, "SETTLE_RETRY_PAUSES", (0.001, 0.001))


def charges_of(account_id: int) -> list[Decimal]:
    db.session.expire_all()
    return list(
        db.session.scalars(
            select(LedgerEntry.amount)
            .where(LedgerEntry.account_id == account_id)
            .order_by(LedgerEntry.id)
        )
    )


def hold_status(hold_id: str) -> str:
    return db.session.scalar(select(Hold.status).where(Hold.id == hold_id))


def test_a_settlement_that_fails_before_committing_is_tried_until_it_commits(
    app_context, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)
    settle_once, failures = settlement._settle_once, []

    def failing_thrice(*args):
        if len(failures) < 3:
            failures.append(1)
            raise lost_connection()
        return settle_once(*args)

    monkeypatch.setattr(settlement, "_settle_once", failing_thrice)
    charged = settlement.settle_hold(held, cost=Decimal("0.15"), generation_id=held.id)

    assert charged == Decimal("0.15") and len(failures) == 3
    assert charges_of(account.id) == [Decimal("1"), Decimal("-0.15")]
    assert hold_status(held.id) == SETTLED
    account_row = db.session.get(Account, account.id)
    assert (account_row.balance, account_row.reserved) == (Decimal("0.85"), 0)


def test_a_settlement_that_committed_before_its_error_is_not_charged_again(
    app_context, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)
    settle_once, tries = settlement._settle_once, []

    def committed_then_lost(*args):
        tries.append(1)
        charge = settle_once(*args)
        if len(tries) == 1:
            raise lost_connection()
        return charge

    monkeypatch.setattr(settlement, "_settle_once", committed_then_lost)
    charged = settlement.settle_hold(held, cost=Decimal("0.15"), generation_id=held.id)

    assert charged == Decimal("0.15")
    assert len(tries) == 1, "the second try found the hold settled and charged nothing"
    assert charges_of(account.id) == [Decimal("1"), Decimal("-0.15")]


def test_an_error_no_try_can_mend_is_raised(app_context, monkeypatch):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)

    def broken(*args):
        raise IntegrityError("INSERT", {}, Exception("a CHECK failed"))

    monkeypatch.setattr(settlement, "_settle_once", broken)
    with pytest.raises(IntegrityError):
        settlement.settle_hold(held, cost=Decimal("0.15"), generation_id=held.id)
    assert hold_status(held.id) == OPEN


def released_hold(account_id: int) -> balances.HeldCredit:
    """A hold released as a dead worker's is: what its late settlement finds."""
    held = holds.place_hold(account_id=account_id, amount=Decimal("0.2"), ttl_seconds=0)
    db.session.execute(update(Hold).where(Hold.id == held.id).values(expires_at=utcnow() - MINUTE))
    db.session.commit()
    assert expiry.release_expired_holds(account_id=account_id) == 1
    return held


def record_of(held: balances.HeldCredit, created_at) -> tuple:
    row = {
        **RECORD_DEFAULTS,
        "id": held.id,
        "account_id": held.account_id,
        "model": "dev-chat",
        "status": "completed",
        "created_at": created_at,
    }
    return insert(Generation), row


def records_of(generation_id: str) -> list:
    found = db.session.scalars(select(Generation.created_at).where(Generation.id == generation_id))
    return list(found)


def test_a_second_settlement_of_a_released_hold_writes_no_second_record(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = released_hold(account.id)
    first = utcnow()
    assert (
        settlement.settle_hold(
            held, cost=Decimal(0), generation_id=held.id, record=record_of(held, first)
        )
        == 0
    )

    # Recorded at another moment: on a table partitioned by time, no key would refuse it.
    with pytest.raises(AlreadyRecorded):
        settlement.settle_hold(
            held, cost=Decimal(0), generation_id=held.id, record=record_of(held, first + MINUTE)
        )
    assert records_of(held.id) == [first]


def test_a_retried_settlement_of_a_released_hold_that_had_committed_returns_its_charge(
    app_context, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("1"))
    held = released_hold(account.id)
    settle_once, tries = settlement._settle_once, []

    def committed_then_lost(*args):
        tries.append(1)
        charge = settle_once(*args)
        if len(tries) == 1:
            raise lost_connection()
        return charge

    monkeypatch.setattr(settlement, "_settle_once", committed_then_lost)
    created_at = utcnow()
    charged = settlement.settle_hold(
        held, cost=Decimal("0.15"), generation_id=held.id, record=record_of(held, created_at)
    )

    assert charged == Decimal("0.15") and len(tries) == 2
    assert charges_of(account.id) == [Decimal("1"), Decimal("-0.15")]
    assert records_of(held.id) == [created_at]
