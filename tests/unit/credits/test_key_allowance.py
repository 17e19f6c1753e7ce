"""A key's monthly limit, held and settled in the same transactions as the balance."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import update

from app.accounts.keys import create_key
from app.auth.errors import InvalidKey
from app.auth.models import ApiKey
from app.budgets import unix_micros
from app.credits import balances, holds, settlement
from app.credits.models import Account, Hold
from app.database import utcnow
from app.extensions import db
from tests.factories import AccountFactory


def limited_key(limit: str, credits: str = "100"):
    account = AccountFactory.create(credits=Decimal(credits))
    issued = create_key(account_id=account.id, name="limited", monthly_limit=Decimal(limit))
    return account, issued.id


def key_counters(key_id: int) -> tuple:
    db.session.expire_all()
    key = db.session.get(ApiKey, key_id)
    return key.window_spent, key.window_reserved


def hold(account, key_id, amount: str):
    return holds.place_hold(
        account_id=account.id, amount=Decimal(amount), ttl_seconds=60, key_id=key_id
    )


def test_holds_reserve_on_the_key_up_to_its_limit(app_context):
    account, key_id = limited_key("1.00")
    first = hold(account, key_id, "0.6")
    assert isinstance(first, balances.HeldCredit) and first.key_id == key_id
    refused = hold(account, key_id, "0.5")
    assert refused == balances.BudgetShortfall(
        requested=Decimal("0.5"),
        available=Decimal("0.4"),
        budget=Decimal("1"),
        window="month",
        holder=balances.KEY_BUDGET,
    )
    assert key_counters(key_id) == (0, Decimal("0.6"))
    db.session.expire_all()
    assert db.session.get(Account, account.id).reserved == Decimal("0.6")
    assert isinstance(hold(account, key_id, "0.4"), balances.HeldCredit)


def test_settlement_moves_the_reservation_to_the_months_spend(app_context):
    account, key_id = limited_key("1.00")
    held = hold(account, key_id, "0.6")
    charged = settlement.settle_hold(held, cost=Decimal("0.25"), generation_id="g-allowance-1")
    assert charged == Decimal("0.25")
    assert key_counters(key_id) == (Decimal("0.25"), 0)
    assert isinstance(hold(account, key_id, "0.75"), balances.HeldCredit)
    assert isinstance(hold(account, key_id, "0.000001"), balances.BudgetShortfall)


def test_a_zero_limit_refuses_any_cost(app_context):
    account, key_id = limited_key("0")
    assert isinstance(hold(account, key_id, "0.0000000001"), balances.BudgetShortfall)
    assert key_counters(key_id) == (0, 0)


def test_a_new_month_starts_from_zero_spend(app_context):
    account, key_id = limited_key("1.00")
    settlement.settle_hold(hold(account, key_id, "1"), cost=Decimal("1"), generation_id="g-month-1")
    assert isinstance(hold(account, key_id, "0.1"), balances.BudgetShortfall)
    last_month = unix_micros(
        balances.month_start(balances.month_start(utcnow()) - timedelta(days=1))
    )
    db.session.execute(update(ApiKey).where(ApiKey.id == key_id).values(window_start=last_month))
    db.session.commit()
    assert isinstance(hold(account, key_id, "1"), balances.HeldCredit)
    assert key_counters(key_id) == (0, Decimal("1"))


def test_the_balance_still_refuses_before_the_key(app_context):
    account, key_id = limited_key("50", credits="1")
    assert isinstance(hold(account, key_id, "2"), balances.Shortfall)
    assert key_counters(key_id) == (0, 0)


def test_an_expired_hold_gives_the_key_its_reservation_back(app_context):
    account, key_id = limited_key("1.00")
    held = hold(account, key_id, "0.8")
    db.session.execute(
        update(Hold).where(Hold.id == held.id).values(expires_at=utcnow() - timedelta(seconds=1))
    )
    db.session.commit()
    assert isinstance(hold(account, key_id, "0.9"), balances.HeldCredit)
    assert key_counters(key_id) == (0, Decimal("0.9"))


def test_a_hold_without_a_key_leaves_keys_alone(app_context):
    account, key_id = limited_key("1.00")
    held = holds.place_hold(account_id=account.id, amount=Decimal("5"), ttl_seconds=60)
    assert held.key_id is None
    settlement.settle_hold(held, cost=Decimal("2"), generation_id="g-no-key-1")
    assert key_counters(key_id) == (0, 0)


def test_a_hold_for_a_key_whose_row_is_gone_is_an_invalid_key_and_holds_nothing(app_context):
    account = AccountFactory.create(credits=Decimal("5"))

    with pytest.raises(InvalidKey):
        hold(account, 987_654_321, "0.5")

    db.session.expire_all()
    assert db.session.get(Account, account.id).reserved == 0
