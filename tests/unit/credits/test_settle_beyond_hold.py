"""Usage priced above its hold is charged as far as the balance and key limit allow."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from sqlalchemy import update

from app.accounts.keys import create_key
from app.auth.models import ApiKey
from app.credits import expiry, holds, settlement
from app.credits.models import Account, Hold
from app.database import utcnow
from app.extensions import db
from tests.factories import AccountFactory


def money(account_id):
    db.session.expire_all()
    account = db.session.get(Account, account_id)
    return account.balance, account.reserved


def test_a_cost_above_the_hold_is_charged_in_full_when_the_balance_covers_it(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=60)
    other = holds.place_hold(account_id=account.id, amount=Decimal("0.5"), ttl_seconds=60)
    charged = settlement.settle_hold(held, cost=Decimal("0.3"), generation_id="g-beyond-1")
    assert charged == Decimal("0.3")
    assert money(account.id) == (Decimal("0.7"), Decimal("0.5"))
    # The other request's hold is not taken: only what is free beyond it can be charged.
    charged = settlement.settle_hold(
        holds.place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=60),
        cost=Decimal("5"),
        generation_id="g-beyond-2",
    )
    assert charged == Decimal("0.2")
    assert money(account.id) == (Decimal("0.5"), Decimal("0.5"))
    assert settlement.settle_hold(
        other, cost=Decimal("0.5"), generation_id="g-beyond-3"
    ) == Decimal("0.5")
    assert money(account.id) == (0, 0)


def test_a_cost_above_the_hold_stops_at_the_keys_monthly_limit(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="k", monthly_limit=Decimal("1")).id
    held = holds.place_hold(
        account_id=account.id, amount=Decimal("0.25"), ttl_seconds=60, key_id=key_id
    )
    charged = settlement.settle_hold(held, cost=Decimal("3"), generation_id="g-beyond-key-1")
    assert charged == Decimal("1")
    db.session.expire_all()
    key = db.session.get(ApiKey, key_id)
    assert (key.window_spent, key.window_reserved) == (Decimal("1"), 0)
    assert money(account.id) == (Decimal("9"), 0)


def test_an_expired_hold_is_charged_within_the_keys_limit(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="k", monthly_limit=Decimal("0.5")).id
    held = holds.place_hold(
        account_id=account.id, amount=Decimal("0.4"), ttl_seconds=60, key_id=key_id
    )
    db.session.execute(
        update(Hold).where(Hold.id == held.id).values(expires_at=utcnow() - timedelta(seconds=1))
    )
    db.session.commit()
    assert expiry.release_expired_holds(account_id=account.id) == 1
    charged = settlement.settle_hold(held, cost=Decimal("0.9"), generation_id="g-expired-key-1")
    assert charged == Decimal("0.5")
    assert money(account.id) == (Decimal("9.5"), 0)
