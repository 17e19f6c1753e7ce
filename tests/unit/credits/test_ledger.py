"""The ledger's transactions, called directly on each test database."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import DatabaseError, IntegrityError

from app.accounts.keys import create_key
from app.auth.models import ApiKey
from app.budgets import window_parameters
from app.credits import balances, expiry, grants, holds, settlement
from app.credits.errors import IdempotencyConflict
from app.credits.models import EXPIRED, OPEN, Account, Hold, LedgerEntry
from app.database import fetch_on_driver, utcnow, write_transaction
from app.extensions import db
from tests.factories import AccountFactory


def state(account_id):
    db.session.expire_all()
    account = db.session.get(Account, account_id)
    total = db.session.scalar(
        select(func.coalesce(func.sum(LedgerEntry.amount), 0)).where(
            LedgerEntry.account_id == account_id
        )
    )
    return account.balance, account.reserved, total


def test_grants_with_the_same_key_apply_once(app_context):
    account = AccountFactory.create()
    first, applied = grants.grant_credits(
        account_id=account.id, amount=Decimal("1.25"), idempotency_key="g-1"
    )
    again, reapplied = grants.grant_credits(
        account_id=account.id, amount=Decimal("1.25"), idempotency_key="g-1"
    )
    assert applied and not reapplied and first.id == again.id
    assert state(account.id) == (Decimal("1.25"), 0, Decimal("1.25"))
    with pytest.raises(IdempotencyConflict):
        grants.grant_credits(account_id=account.id, amount=Decimal("2"), idempotency_key="g-1")


def test_a_hold_never_exceeds_the_available_balance(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.6"), ttl_seconds=60)
    assert isinstance(held, balances.HeldCredit)
    refused = holds.place_hold(account_id=account.id, amount=Decimal("0.5"), ttl_seconds=60)
    assert refused == balances.Shortfall(
        requested=Decimal("0.5"), available=Decimal("0.4"), balance=Decimal("1")
    )
    assert not refused.in_debt
    assert state(account.id) == (Decimal("1"), Decimal("0.6"), Decimal("1"))


def test_credit_taken_back_below_zero_refuses_every_hold_until_paid_back(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    write_transaction(
        lambda connection: grants.take_back_within(
            connection,
            account_id=account.id,
            amount=Decimal("3"),
            idempotency_key="refund-1",
            description="refund",
        )
    )
    assert state(account.id) == (Decimal("-2"), 0, Decimal("-2"))
    refused = holds.place_hold(account_id=account.id, amount=Decimal("0"), ttl_seconds=60)
    assert isinstance(refused, balances.Shortfall) and refused.in_debt
    assert refused.balance == Decimal("-2")
    grants.grant_credits(account_id=account.id, amount=Decimal("2"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0"), ttl_seconds=60)
    assert isinstance(held, balances.HeldCredit)


def test_settling_charges_the_cost_and_frees_the_hold(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.5"), ttl_seconds=60)
    charged = settlement.settle_hold(held, cost=Decimal("0.1234567891"), generation_id="gen-a")
    assert charged == Decimal("0.1234567891")
    assert state(account.id) == (Decimal("0.8765432109"), 0, Decimal("0.8765432109"))
    entry = db.session.scalar(select(LedgerEntry).where(LedgerEntry.generation_id == "gen-a"))
    assert (entry.account_id, entry.kind, entry.amount) == (
        account.id,
        "charge",
        Decimal("-0.1234567891"),
    )
    assert db.session.get(Hold, held.id).status == "settled"


def test_a_charge_beyond_its_hold_is_paid_from_the_free_balance_not_capped(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)
    assert settlement.settle_hold(held, cost=Decimal("0.3"), generation_id="gen-b") == Decimal(
        "0.3"
    )


def test_nothing_produced_is_not_charged(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)
    assert settlement.settle_hold(held, cost=Decimal(0), generation_id="gen-c") == 0
    assert state(account.id) == (Decimal("1"), 0, Decimal("1"))
    assert (
        db.session.scalar(select(LedgerEntry).where(LedgerEntry.generation_id == "gen-c")) is None
    )


def test_a_generation_is_charged_once_even_if_settled_twice(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.2"), ttl_seconds=60)
    settlement.settle_hold(held, cost=Decimal("0.1"), generation_id="gen-d")
    with pytest.raises(IntegrityError):
        settlement.settle_hold(held, cost=Decimal("0.1"), generation_id="gen-d")
    db.session.rollback()
    assert state(account.id) == (Decimal("0.9"), 0, Decimal("0.9"))


def expire_now(hold_id):
    db.session.execute(update(Hold).where(Hold.id == hold_id).values(expires_at=Hold.created_at))
    db.session.commit()


def test_expired_holds_are_released_once(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.7"), ttl_seconds=60)
    expire_now(held.id)
    assert expiry.release_expired_holds(account_id=account.id) == 1
    assert expiry.release_expired_holds(account_id=account.id) == 0
    assert state(account.id) == (Decimal("1"), 0, Decimal("1"))
    assert db.session.get(Hold, held.id).status == EXPIRED


def test_an_expired_hold_in_the_way_is_released_to_place_a_new_one(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    stale = holds.place_hold(account_id=account.id, amount=Decimal("0.9"), ttl_seconds=60)
    expire_now(stale.id)
    fresh = holds.place_hold(account_id=account.id, amount=Decimal("0.9"), ttl_seconds=60)
    assert isinstance(fresh, balances.HeldCredit)


def test_a_late_settlement_after_expiry_charges_only_what_is_available(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.5"), ttl_seconds=60)
    expire_now(held.id)
    expiry.release_expired_holds(account_id=account.id)
    other = holds.place_hold(account_id=account.id, amount=Decimal("0.8"), ttl_seconds=60)
    assert isinstance(other, balances.HeldCredit)
    charged = settlement.settle_hold(held, cost=Decimal("0.4"), generation_id="gen-e")
    assert charged == Decimal("0.2")
    balance, reserved, total = state(account.id)
    assert (balance, reserved, total) == (Decimal("0.8"), Decimal("0.8"), Decimal("0.8"))


def test_an_open_hold_can_be_extended(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=1)
    before = db.session.get(Hold, held.id).expires_at
    expiry.extend_holds([held.id], ttl_seconds=600)
    db.session.expire_all()
    assert (db.session.get(Hold, held.id).expires_at - before).total_seconds() > 500


def test_credit_summary(app_context):
    account = AccountFactory.create(credits=Decimal("3"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("1"), ttl_seconds=60)
    settlement.settle_hold(held, cost=Decimal("0.25"), generation_id="gen-f")
    assert balances.credit_summary(account.id) == balances.CreditSummary(
        granted=Decimal("3"), used=Decimal("0.25"), balance=Decimal("2.75")
    )


@pytest.mark.parametrize(
    "statement",
    [
        lambda: update(LedgerEntry).values(amount=Decimal("1000")),
        lambda: delete(LedgerEntry),
    ],
    ids=["update", "delete"],
)
def test_the_database_refuses_to_change_or_remove_ledger_entries(app_context, statement):
    account = AccountFactory.create(credits=Decimal("1"))
    with pytest.raises(DatabaseError, match="append-only"):
        db.session.execute(statement().where(LedgerEntry.account_id == account.id))
        db.session.commit()
    db.session.rollback()
    assert state(account.id) == (Decimal("1"), 0, Decimal("1"))


def test_a_hold_commits_without_waiting_for_the_disk_and_only_itself(app_context):
    # What a server crash may lose is a hold, never what commits after it on the connection.
    if db.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's hold is one statement, its own transaction")
    account = AccountFactory.create(credits=Decimal("1"))
    now = utcnow()
    hold = {
        "id": "hold-commit-mode",
        "account_id": account.id,
        "amount": Decimal("0.5"),
        "api_key_id": None,
        "status": OPEN,
        "created_at": now,
        "expires_at": now,
    }
    statement, parameters = holds.hold_statement(hold, window_parameters(now))
    with db.engine.connect() as connection:
        with connection.begin():
            assert fetch_on_driver(connection, statement, parameters)[0][0] == 1
            assert connection.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"
        assert connection.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    assert state(account.id) == (Decimal("1"), Decimal("0.5"), Decimal("1"))


def test_every_settlement_records_its_keys_use(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    key_id = create_key(account_id=account.id, name="used").id
    used = []
    for number in range(2):
        held = holds.place_hold(
            account_id=account.id, amount=Decimal("0.1"), ttl_seconds=60, key_id=key_id
        )
        settlement.settle_hold(held, cost=Decimal("0.01"), generation_id=f"g-use-{key_id}-{number}")
        db.session.expire_all()
        used.append(db.session.get(ApiKey, key_id).last_used_at)
        db.session.commit()

    assert used[0] is not None and used[1] > used[0]
