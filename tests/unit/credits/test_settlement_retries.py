"""A settlement is never lost to a database error that another try can mend, nor doubled."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError, OperationalError

from app.credits import ledger
from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from tests.factories import AccountFactory


def lost_connection() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


@pytest.fixture(autouse=True)
def no_pauses(monkeypatch):
    monkeypatch.setattr(ledger, "SETTLE_RETRY_PAUSES", (0.001, 0.001))


def charges_of(account_id: int) -> list[Decimal]:
    db.session.expire_all()
    return list(
        db.session.scalars(select(LedgerEntry.amount).where(LedgerEntry.account_id == account_id))
    )


def hold_status(hold_id: str) -> str:
    return db.session.scalar(select(Hold.status).where(Hold.id == hold_id))


def test_a_settlement_that_fails_before_committing_is_tried_until_it_commits(
    app_context, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("1"))
    held = ledger.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)
    settle_once, failures = ledger._settle_once, []

    def failing_thrice(*args):
        if len(failures) < 3:
            failures.append(1)
            raise lost_connection()
        return settle_once(*args)

    monkeypatch.setattr(ledger, "_settle_once", failing_thrice)
    charged = ledger.settle_hold(held, cost=Decimal("0.15"), generation_id=held.id)

    assert charged == Decimal("0.15") and len(failures) == 3
    assert charges_of(account.id) == [Decimal("1"), Decimal("-0.15")]
    assert hold_status(held.id) == ledger.SETTLED
    account_row = db.session.get(Account, account.id)
    assert (account_row.balance, account_row.reserved) == (Decimal("0.85"), 0)


def test_a_settlement_that_committed_before_its_error_is_not_charged_again(
    app_context, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("1"))
    held = ledger.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)
    settle_once, tries = ledger._settle_once, []

    def committed_then_lost(*args):
        tries.append(1)
        charge = settle_once(*args)
        if len(tries) == 1:
            raise lost_connection()
        return charge

    monkeypatch.setattr(ledger, "_settle_once", committed_then_lost)
    charged = ledger.settle_hold(held, cost=Decimal("0.15"), generation_id=held.id)

    assert charged == Decimal("0.15")
    assert len(tries) == 1, "the second try found the hold settled and charged nothing"
    assert charges_of(account.id) == [Decimal("1"), Decimal("-0.15")]


def test_an_error_no_try_can_mend_is_raised(app_context, monkeypatch):
    account = AccountFactory.create(credits=Decimal("1"))
    held = ledger.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)

    def broken(*args):
        raise IntegrityError("INSERT", {}, Exception("a CHECK failed"))

    monkeypatch.setattr(ledger, "_settle_once", broken)
    with pytest.raises(IntegrityError):
        ledger.settle_hold(held, cost=Decimal("0.15"), generation_id=held.id)
    assert hold_status(held.id) == ledger.OPEN
