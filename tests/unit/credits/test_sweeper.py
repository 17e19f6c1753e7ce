"""The sweeper renews the holds of running requests and only theirs."""

from __future__ import annotations

import gc
from datetime import timedelta
from decimal import Decimal

from app.credits import ledger
from app.credits.models import Hold
from app.credits.sweeper import LiveHolds, renew_live_holds
from app.database import utcnow
from app.extensions import db
from tests.factories import AccountFactory


class Request:
    """Stands for a running request's object."""


def expiry(hold_id):
    db.session.expire_all()
    return db.session.get(Hold, hold_id).expires_at


def test_live_holds_forget_requests_that_are_gone():
    holds = LiveHolds()
    running, abandoned = Request(), Request()
    holds.track("h-running", running)
    holds.track("h-abandoned", abandoned)
    holds.track("h-settled", running)
    holds.forget("h-settled")
    del abandoned
    gc.collect()
    assert holds.hold_ids() == ["h-running"]


def test_renewal_pushes_only_the_live_open_holds_forward(app):
    with app.app_context():
        account = AccountFactory.create(credits=Decimal("1"))
        live = ledger.place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=1)
        idle = ledger.place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=1)
        settled = ledger.place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=1)
        ledger.settle_hold(settled, cost=Decimal("0.01"), generation_id="g-sweeper-1")
        before = {hold.id: expiry(hold.id) for hold in (live, idle, settled)}
    holds, request = LiveHolds(), Request()
    holds.track(live.id, request)
    holds.track(settled.id, request)
    assert renew_live_holds(app, holds) == 1
    with app.app_context():
        ttl = timedelta(seconds=app.config["HOLD_TTL_SECONDS"])
        assert expiry(live.id) >= utcnow() + ttl - timedelta(seconds=5)
        assert expiry(idle.id) == before[idle.id]
        assert expiry(settled.id) == before[settled.id]
