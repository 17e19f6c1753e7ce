"""Auto top-up: the card saved at Checkout pays one off-session top-up per crossing.

The sweeper's duty runs in several threads at once, as the workers' sweepers would; the
local Stripe answers the PaymentIntents and the test delivers their events, signed.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
from sqlalchemy import select

from app.alerts.models import AlertEvent
from app.extensions import db
from app.payments import topups
from app.payments.events import apply_event
from app.payments.models import AutoTopup
from tests.payments.conftest import (
    books,
    intents_for,
    new_account,
    run_sweepers,
    save_card_at_checkout,
)
from tests.stripe_server import DECLINED_CARD


def test_one_crossing_makes_one_off_session_payment_credited_by_its_event(
    sweeping_app, payments_server, fake_stripe
):
    app = sweeping_app
    account_id = new_account(app)
    save_card_at_checkout(app, fake_stripe, account_id)
    with app.app_context():
        card = topups.topup_of(account_id)
        assert card.payment_method_id == "pm_card_visa" and card.customer_id.startswith("cus_")
        topups.configure(account_id, enabled=True, threshold=Decimal(25), amount=Decimal(10))
    # $20 is below the $25 threshold: eight sweepers at once make one payment.
    assert run_sweepers(app) == 1
    ((params, headers),) = intents_for(fake_stripe, account_id, app)
    assert params["off_session"] == "true" and params["confirm"] == "true"
    assert params["amount"] == "1030" and params["payment_method"] == "pm_card_visa"
    assert headers["Idempotency-Key"] == f"topup-{params['metadata']['order_id']}"
    assert run_sweepers(app) == 0, "still pending: no second payment for the same crossing"
    intent = fake_stripe.intents[
        next(i for i, v in fake_stripe.intents.items() if v["metadata"] == params["metadata"])
    ]
    event = fake_stripe.event("payment_intent.succeeded", intent)
    assert fake_stripe.deliver(event).json()["result"] == "applied"
    assert fake_stripe.deliver(event).json()["result"] == "duplicate"
    balance, _, orders = books(app, account_id)
    topup = next(order for order in orders if order.kind == "auto_topup")
    assert balance == Decimal(30) and topup.status == "paid" and topup.fee == Decimal("0.30")
    # Above the threshold again: armed, and nothing to buy.
    assert run_sweepers(app, workers=2) == 0
    with app.app_context():
        assert topups.topup_of(account_id).armed


def test_three_declines_in_a_row_turn_auto_top_up_off_with_an_alert(
    sweeping_app, payments_server, fake_stripe
):
    app = sweeping_app
    account_id = new_account(app)
    save_card_at_checkout(app, fake_stripe, account_id)
    with app.app_context():
        topups.configure(account_id, enabled=True, threshold=Decimal(25), amount=Decimal(10))
        row = db.session.get(AutoTopup, account_id)
        row.payment_method_id = DECLINED_CARD
        db.session.commit()
    # One sweep after another: each tries once.
    for tried in (1, 2, 3):
        assert run_sweepers(app, workers=1) == 0
        assert len(intents_for(fake_stripe, account_id, app)) == tried
    assert run_sweepers(app, workers=3) == 0
    assert len(intents_for(fake_stripe, account_id, app)) == 3
    balance, _, orders = books(app, account_id)
    assert balance == Decimal(20)
    assert sorted(o.status for o in orders if o.kind == "auto_topup") == ["failed"] * 3
    with app.app_context():
        topup = topups.topup_of(account_id)
        assert not topup.enabled and topup.failures == 3
        alerts = db.session.scalars(
            select(AlertEvent.type).where(AlertEvent.account_id == account_id)
        ).all()
        assert alerts.count("topup.failed") == 1


def test_a_failure_event_after_a_decline_counts_once(sweeping_app, payments_server, fake_stripe):
    app = sweeping_app
    account_id = new_account(app)
    save_card_at_checkout(app, fake_stripe, account_id)
    with app.app_context():
        topups.configure(account_id, enabled=True, threshold=Decimal(25), amount=Decimal(10))
        db.session.get(AutoTopup, account_id).payment_method_id = DECLINED_CARD
        db.session.commit()
    run_sweepers(app, workers=1)
    ((params, _),) = intents_for(fake_stripe, account_id, app)
    intent = next(v for v in fake_stripe.intents.values() if v["metadata"] == params["metadata"])
    failed = fake_stripe.deliver(fake_stripe.event("payment_intent.payment_failed", intent))
    assert failed.status_code == 200
    with app.app_context():
        assert topups.topup_of(account_id).failures == 1


def test_auto_top_up_needs_a_saved_card_and_amounts_within_bounds(sweeping_app):
    app = sweeping_app
    account_id = new_account(app)
    with app.app_context():
        with pytest.raises(topups.InvalidAmount, match="Save a card first"):
            topups.configure(account_id, enabled=True, threshold=Decimal(5), amount=Decimal(10))
        with pytest.raises(topups.InvalidAmount):
            topups.configure(account_id, enabled=False, threshold=Decimal(5), amount=Decimal(1))
        topups.configure(account_id, enabled=False, threshold=Decimal(5), amount=Decimal(10))
        assert not topups.topup_of(account_id).enabled


def test_a_sweep_that_read_a_crossing_paid_since_makes_no_second_payment(sweeping_app, monkeypatch):
    """A sweeper reads the organisation due, then the top-up is paid and re-armed; then it claims.

    The crossing it read is over: the balance is above the threshold again.
    """
    app = sweeping_app
    account_id = new_account(app, Decimal(20))
    with app.app_context():
        db.session.add(AutoTopup(account_id=account_id, customer_id="cus_1", armed=True))
        db.session.get(AutoTopup, account_id).payment_method_id = "pm_card_visa"
        db.session.commit()
        topups.configure(account_id, enabled=True, threshold=Decimal(25), amount=Decimal(10))
    late, read, release = threading.local(), threading.Event(), threading.Event()
    claim = topups._claim

    def claim_late(claimed_id):
        if getattr(late, "sweeper", False):
            read.set()
            release.wait(timeout=60)
        return claim(claimed_id)

    def late_sweep():
        late.sweeper = True
        with app.app_context():
            return topups.top_up_where_due()

    monkeypatch.setattr(topups, "_claim", claim_late)
    with ThreadPoolExecutor(max_workers=1) as pool:
        slow = pool.submit(late_sweep)
        assert read.wait(timeout=60)
        assert run_sweepers(app, workers=1) == 1
        (order,) = books(app, account_id)[2]
        with app.app_context():
            intent = {"id": "pi_1", "amount": order.total_cents, "currency": "usd"}
            intent["metadata"], intent["amount_received"] = {"order_id": order.id}, intent["amount"]
            apply_event(
                {"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": intent}}
            )
        assert run_sweepers(app, workers=1) == 0
        with app.app_context():
            assert topups.topup_of(account_id).armed
        release.set()
        assert slow.result() == 0
    balance, _, orders = books(app, account_id)
    assert balance == Decimal(30) and [o.status for o in orders] == ["paid"]
