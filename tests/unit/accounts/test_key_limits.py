"""Per-key limits: which models a key may use and what it may spend a month."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import insert

from app.accounts.errors import InvalidKeyLimits, KeyNotFound
from app.accounts.keys import create_key, update_key_limits
from app.auth.keys import find_caller
from app.auth.models import ApiKey
from app.credits.balances import BudgetShortfall
from app.credits.holds import place_hold
from app.credits.settlement import Rollup, hour_of, settle_hold
from app.database import utcnow
from app.extensions import db
from app.generations.models import Generation
from app.generations.usage import key_spend
from tests.factories import AccountFactory


def record_generation(account_id: int, key_id: int, cost: str, created_at) -> None:
    """Charge a generation of ``cost`` on the key through the ledger, as settlement does."""
    amount = Decimal(cost)
    held = place_hold(account_id=account_id, amount=amount, ttl_seconds=60, key_id=key_id)
    generation_id = f"gen-{uuid.uuid4().hex}"
    # Every column, as a settlement's record has them: defaults are not filled in for
    # the record of a settlement run as one statement with its rollup.
    defaults = {
        column.name: column.default.arg
        for column in Generation.__table__.columns
        if column.default is not None and not callable(column.default.arg)
    }
    record = {
        **defaults,
        "id": generation_id,
        "account_id": account_id,
        "api_key_id": key_id,
        "model": "dev-chat",
        # 1,000 completion tokens priced so that they cost exactly ``cost``.
        "completion_tokens": 1000,
        "price_completion": amount * 1000,
        "status": "completed",
        "created_at": created_at,
    }
    rollup = Rollup(model="dev-chat", hour=hour_of(created_at), completion_tokens=1000)
    settle_hold(
        held,
        cost=amount,
        generation_id=generation_id,
        record=(insert(Generation), record),
        rollup=rollup,
    )


def test_a_new_key_is_unlimited_by_default(app_context):
    account = AccountFactory.create()
    issued = create_key(account_id=account.id, name="plain")
    caller = find_caller(issued.value)
    assert caller.permitted_models is None
    assert caller.may_use("dev-chat") and caller.may_use("dev-slow")


def test_a_key_limited_at_creation_may_use_only_its_models(app_context):
    account = AccountFactory.create()
    issued = create_key(
        account_id=account.id,
        name="limited",
        permitted_models=["dev-chat-mini", "dev-chat-mini"],
        monthly_limit=Decimal("0.000010"),
    )
    key = db.session.get(ApiKey, issued.id)
    assert key.permitted_models == ["dev-chat-mini"]
    assert key.budget == Decimal("0.00001")
    caller = find_caller(issued.value)
    assert caller.may_use("dev-chat-mini") and not caller.may_use("dev-chat")
    assert db.session.get(ApiKey, issued.id).budget == Decimal("0.00001")


@pytest.mark.parametrize(
    ("models", "limit", "problem"),
    [
        (["dev-chat", "gpt-nonexistent"], None, "unknown model id 'gpt-nonexistent'"),
        (["dev-hidden"], None, "unknown model id 'dev-hidden'"),
        ([], None, "at least one model"),
        ("dev-chat", None, "a list of model ids"),
        (None, Decimal("-0.01"), "must not be negative"),
        (None, Decimal("0.0000001"), "more than 6 decimal places"),
        (None, Decimal("NaN"), "an amount in USD"),
        (None, 1.5, "an amount in USD"),
        (None, Decimal("1e9"), "at most"),
    ],
)
def test_invalid_limits_are_refused_and_nothing_is_written(app_context, models, limit, problem):
    account = AccountFactory.create()
    with pytest.raises(InvalidKeyLimits, match=problem):
        create_key(account_id=account.id, name="bad", permitted_models=models, monthly_limit=limit)
    assert db.session.query(ApiKey).filter_by(account_id=account.id).count() == 0
    issued = create_key(account_id=account.id, name="good")
    with pytest.raises(InvalidKeyLimits, match=problem):
        update_key_limits(issued.id, permitted_models=models, monthly_limit=limit)
    db.session.expire_all()
    key = db.session.get(ApiKey, issued.id)
    assert key.permitted_models is None and key.budget is None


@pytest.mark.parametrize("limit", [Decimal(0), Decimal("0.000010"), Decimal("12.5"), 3])
def test_zero_and_six_decimal_limits_are_valid(app_context, limit):
    account = AccountFactory.create()
    issued = create_key(account_id=account.id, name="k", monthly_limit=limit)
    assert db.session.get(ApiKey, issued.id).budget == Decimal(limit)


def test_update_key_limits_sets_and_clears_them(app_context):
    account = AccountFactory.create()
    issued = create_key(account_id=account.id, name="k")
    key = update_key_limits(issued.id, permitted_models=["dev-chat"], monthly_limit=Decimal("2"))
    assert key.permitted_models == ["dev-chat"] and key.budget == Decimal("2")
    assert find_caller(issued.value).may_use("dev-chat-mini") is False
    update_key_limits(issued.id, permitted_models=None, monthly_limit=None)
    caller = find_caller(issued.value)
    assert caller.permitted_models is None


def test_update_key_limits_of_an_unknown_key_raises(app_context):
    with pytest.raises(KeyNotFound):
        update_key_limits(10**9, permitted_models=None, monthly_limit=Decimal("1"))


def test_key_spend_sums_the_keys_charges_from_the_hour_of_a_moment(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    issued = create_key(account_id=account.id, name="k")
    other = create_key(account_id=account.id, name="other")
    now = utcnow()
    hour = hour_of(now)
    record_generation(account.id, issued.id, "0.25", now - timedelta(days=40))
    record_generation(account.id, issued.id, "0.0000000001", hour - timedelta(minutes=1))
    record_generation(account.id, issued.id, "1.5", now)
    record_generation(account.id, other.id, "7", now)
    assert key_spend(issued.id, since=now) == Decimal("1.5")
    assert key_spend(issued.id, since=hour - timedelta(seconds=1)) == Decimal("1.5000000001")
    assert key_spend(issued.id, since=now - timedelta(days=60)) == Decimal("1.7500000001")
    assert key_spend(issued.id, since=hour + timedelta(hours=1)) == 0


def test_a_limit_set_mid_month_counts_what_the_key_already_spent(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    issued = create_key(account_id=account.id, name="k")
    now = utcnow()
    record_generation(account.id, issued.id, "0.4", now)
    key = update_key_limits(issued.id, permitted_models=None, monthly_limit=Decimal("1"))
    assert key.window_spent == Decimal("0.4")


def test_a_limit_set_while_a_request_runs_counts_its_hold_and_caps_its_charge(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    issued = create_key(account_id=account.id, name="k")
    running = place_hold(
        account_id=account.id, amount=Decimal("0.6"), ttl_seconds=60, key_id=issued.id
    )
    update_key_limits(issued.id, permitted_models=None, monthly_limit=Decimal("1"))

    refused = place_hold(
        account_id=account.id, amount=Decimal("0.5"), ttl_seconds=60, key_id=issued.id
    )
    assert isinstance(refused, BudgetShortfall)
    assert refused.available == Decimal("0.4")
    # Usage beyond the hold is charged only as far as the limit still allows.
    charged = settle_hold(running, cost=Decimal("1.5"), generation_id=f"gen-{uuid.uuid4().hex}")
    assert charged == Decimal("1")
    key = db.session.get(ApiKey, issued.id)
    db.session.refresh(key)
    assert (key.window_spent, key.window_reserved) == (Decimal("1"), 0)
