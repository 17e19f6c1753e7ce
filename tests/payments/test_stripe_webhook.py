"""Stripe's webhook over real HTTP: payments become credits exactly once, refunds take them back.

Events are signed by the ``stripe`` library's own scheme and posted to a real gunicorn;
the books are read from the database.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import requests
from sqlalchemy import select

from app.extensions import db
from app.payments.models import StripeEvent
from tests.payments.conftest import books, checkout_order, new_account

TOTAL_OF_20 = 2060  # $20.00 of credits and its 3% fee, in cents


def paid(fake, session):
    session, charge = fake.pay(session["id"])
    return fake.event("checkout.session.completed", _public(session)), charge


def _public(session):
    return {key: value for key, value in session.items() if key != "payment_intent_data"}


def test_a_paid_checkout_grants_its_credits_once_and_redelivery_grants_nothing(
    app, payments_server, fake_stripe
):
    account_id = new_account(app)
    session = checkout_order(app, fake_stripe, account_id)
    event, charge = paid(fake_stripe, session)
    first = fake_stripe.deliver(event)
    again = fake_stripe.deliver(event)
    assert first.status_code == 200 and first.json()["result"] == "applied"
    assert again.status_code == 200 and again.json()["result"] == "duplicate"
    receipt = fake_stripe.deliver(fake_stripe.event("charge.succeeded", charge))
    assert receipt.status_code == 200
    balance, entries, (order,) = books(app, account_id)
    assert balance == Decimal("20")
    assert [(e.kind, e.amount, e.idempotency_key) for e in entries] == [
        ("grant", Decimal("20"), f"order:{order.id}")
    ]
    assert order.status == "paid" and order.fee == Decimal("0.60")
    assert order.total_cents == TOTAL_OF_20
    assert order.payment_intent_id == charge["payment_intent"]
    assert order.receipt_url == charge["receipt_url"]


def test_fifty_concurrent_deliveries_of_one_event_grant_once(app, payments_server, fake_stripe):
    account_id = new_account(app)
    event, _ = paid(fake_stripe, checkout_order(app, fake_stripe, account_id))
    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda _: fake_stripe.deliver(event), range(50)))
    assert all(answer.status_code == 200 for answer in answers)
    results = sorted(answer.json()["result"] for answer in answers)
    assert results == ["applied"] + ["duplicate"] * 49
    balance, entries, _ = books(app, account_id)
    assert balance == Decimal("20") and len(entries) == 1
    with app.app_context():
        assert db.session.get(StripeEvent, event["id"]).type == "checkout.session.completed"


def test_every_paying_event_of_one_order_grants_once_in_any_order(
    app, payments_server, fake_stripe
):
    account_id = new_account(app)
    session = checkout_order(app, fake_stripe, account_id)
    session, _ = fake_stripe.pay(session["id"])
    # A delayed method: its success comes first, its completion (still unpaid) after,
    # then a failure that cannot undo what was paid.
    succeeded = fake_stripe.event("checkout.session.async_payment_succeeded", _public(session))
    completed = fake_stripe.event(
        "checkout.session.completed", {**_public(session), "payment_status": "unpaid"}
    )
    failed = fake_stripe.event("checkout.session.async_payment_failed", _public(session))
    for event in (succeeded, completed, failed):
        assert fake_stripe.deliver(event).status_code == 200
    balance, entries, (order,) = books(app, account_id)
    assert balance == Decimal("20") and len(entries) == 1 and order.status == "paid"


def test_a_delayed_payment_that_fails_fails_its_order(app, payments_server, fake_stripe):
    account_id = new_account(app)
    session = checkout_order(app, fake_stripe, account_id)
    pending = {**_public(session), "status": "complete", "payment_status": "unpaid"}
    assert fake_stripe.deliver(fake_stripe.event("checkout.session.completed", pending)).ok
    assert books(app, account_id)[2][0].status == "pending"
    event = fake_stripe.event("checkout.session.async_payment_failed", pending)
    assert fake_stripe.deliver(event).status_code == 200
    balance, entries, (order,) = books(app, account_id)
    assert balance == 0 and entries == [] and order.status == "failed"


def test_a_checkout_session_left_unpaid_expires_its_order(app, payments_server, fake_stripe):
    account_id = new_account(app)
    session = checkout_order(app, fake_stripe, account_id)
    expired = {**_public(session), "status": "expired"}
    answer = fake_stripe.deliver(fake_stripe.event("checkout.session.expired", expired))
    assert answer.status_code == 200 and answer.json()["result"] == "applied"
    balance, entries, (order,) = books(app, account_id)
    assert balance == 0 and entries == [] and order.status == "expired"


def test_a_bad_signature_is_refused_and_applies_nothing(app, payments_server, fake_stripe):
    account_id = new_account(app)
    event, _ = paid(fake_stripe, checkout_order(app, fake_stripe, account_id))
    forged = fake_stripe.deliver(event, secret="whsec_not_the_gateways")
    assert forged.status_code == 400
    assert forged.json()["error"]["code"] == "invalid_signature"
    unsigned = requests.post(fake_stripe.webhook_url, data=json.dumps(event), timeout=10)
    assert unsigned.status_code == 400
    balance, entries, (order,) = books(app, account_id)
    assert balance == 0 and entries == [] and order.status == "pending"
    with app.app_context():
        assert db.session.get(StripeEvent, event["id"]) is None


def test_an_amount_or_currency_mismatch_is_refused_logged_and_retried(
    app, payments_server, fake_stripe
):
    account_id = new_account(app)
    session = checkout_order(app, fake_stripe, account_id)
    session, _ = fake_stripe.pay(session["id"])
    cheaper = {**_public(session), "amount_total": 100}
    event = fake_stripe.event("checkout.session.completed", cheaper)
    refused = fake_stripe.deliver(event)
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "event_not_applied"
    euros = fake_stripe.event("checkout.session.completed", {**_public(session), "currency": "eur"})
    assert fake_stripe.deliver(euros).status_code == 409
    balance, entries, (order,) = books(app, account_id)
    assert balance == 0 and entries == [] and order.status == "pending"
    log = payments_server.log()
    assert f"Stripe event {event['id']} (checkout.session.completed) not applied" in log
    assert "100 usd" in log and "whsec_" not in log
    # Not recorded: the same id, delivered right, is applied.
    right = fake_stripe.event("checkout.session.completed", _public(session), event["id"])
    assert fake_stripe.deliver(right).json()["result"] == "applied"
    assert books(app, account_id)[0] == Decimal("20")


def test_refunds_take_back_credit_even_spent_and_debt_refuses_every_door(
    app, payments_server, fake_stripe
):
    account_id = new_account(app)
    with app.app_context():
        from app.accounts.keys import create_key

        key = create_key(account_id=account_id, name="spender").value
    event, charge = paid(fake_stripe, checkout_order(app, fake_stripe, account_id))
    assert fake_stripe.deliver(event).status_code == 200
    # A partial refund: a quarter of what was paid takes back a quarter of the credit.
    partial = fake_stripe.refund(charge["id"], TOTAL_OF_20 // 4)
    assert fake_stripe.deliver(fake_stripe.event("charge.refunded", partial)).status_code == 200
    assert books(app, account_id)[0] == Decimal("15")
    # Some of the credit is spent, then the payment is refunded whole.
    chat = _chat(payments_server, key)
    assert chat.status_code == 200
    whole = fake_stripe.refund(charge["id"], TOTAL_OF_20 - TOTAL_OF_20 // 4)
    refund_event = fake_stripe.event("charge.refunded", whole)
    assert fake_stripe.deliver(refund_event).status_code == 200
    assert fake_stripe.deliver(refund_event).json()["result"] == "duplicate"
    balance, entries, (order,) = books(app, account_id)
    spent = -sum(e.amount for e in entries if e.kind == "charge")
    assert spent > 0 and balance == -spent
    assert [e.amount for e in entries if e.kind == "take_back"] == [Decimal(-5), Decimal(-15)]
    assert order.refunded_cents == TOTAL_OF_20 and order.taken_back == Decimal(20)
    refused = _chat(payments_server, key)
    assert refused.status_code == 402
    assert refused.json()["error"]["code"] == "account_in_debt"
    messages = requests.post(
        f"{payments_server.url}/v1/messages",
        headers={"x-api-key": key, "anthropic-version": "2023-06-01"},
        json={"model": "dev-chat-mini", "max_tokens": 5, "messages": [_hello()]},
        timeout=30,
    )
    assert messages.status_code == 402
    assert messages.json()["type"] == "error"
    assert messages.json()["error"]["type"] == "billing_error"
    assert "in debt" in messages.json()["error"]["message"]
    responses = requests.post(
        f"{payments_server.url}/v1/responses",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "dev-chat-mini", "input": "hello"},
        timeout=30,
    )
    assert responses.status_code == 402
    assert responses.json()["error"]["code"] == "account_in_debt"
    gemini = requests.post(
        f"{payments_server.url}/v1beta/models/dev-chat-mini:generateContent",
        headers={"x-goog-api-key": key},
        json={"contents": [{"role": "user", "parts": [{"text": "hello"}]}]},
        timeout=30,
    )
    assert gemini.status_code == 402
    assert gemini.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert "in debt" in gemini.json()["error"]["message"]
    embeddings = requests.post(
        f"{payments_server.url}/v1/embeddings",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "dev-embed", "input": "hello"},
        timeout=30,
    )
    assert embeddings.status_code == 402
    assert embeddings.json()["error"]["code"] == "account_in_debt"
    # Paid back, the account is served again.
    with app.app_context():
        from app.credits.grants import grant_credits

        grant_credits(account_id=account_id, amount=spent + 1)
    assert _chat(payments_server, key).status_code == 200


def _hello():
    return {"role": "user", "content": "hello"}


def _chat(server, key):
    return requests.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "dev-chat-mini", "messages": [_hello()]},
        timeout=30,
    )


def test_a_dispute_takes_the_credit_back_until_it_is_won(app, payments_server, fake_stripe):
    account_id = new_account(app)
    event, charge = paid(fake_stripe, checkout_order(app, fake_stripe, account_id))
    fake_stripe.deliver(event)
    opened = fake_stripe.event("charge.dispute.created", fake_stripe.dispute(charge["id"]))
    assert fake_stripe.deliver(opened).status_code == 200
    assert books(app, account_id)[0] == 0
    won = fake_stripe.event("charge.dispute.closed", fake_stripe.dispute(charge["id"], "won"))
    assert fake_stripe.deliver(won).status_code == 200
    assert fake_stripe.deliver(won).json()["result"] == "duplicate"
    balance, entries, (order,) = books(app, account_id)
    assert balance == Decimal(20) and order.dispute == "won"
    assert [e.amount for e in entries] == [Decimal(20), Decimal(-20), Decimal(20)]


def test_a_dispute_lost_before_its_opening_arrives_takes_back_once(
    app, payments_server, fake_stripe
):
    account_id = new_account(app)
    event, charge = paid(fake_stripe, checkout_order(app, fake_stripe, account_id))
    fake_stripe.deliver(event)
    lost = fake_stripe.event("charge.dispute.closed", fake_stripe.dispute(charge["id"], "lost"))
    opened = fake_stripe.event("charge.dispute.created", fake_stripe.dispute(charge["id"]))
    assert fake_stripe.deliver(lost).status_code == 200
    assert fake_stripe.deliver(opened).status_code == 200
    balance, entries, (order,) = books(app, account_id)
    assert balance == 0 and order.dispute == "lost" and len(entries) == 2


def test_a_refund_before_its_payment_is_applied_waits_for_it(app, payments_server, fake_stripe):
    account_id = new_account(app)
    event, charge = paid(fake_stripe, checkout_order(app, fake_stripe, account_id))
    refund = fake_stripe.event("charge.refunded", fake_stripe.refund(charge["id"], TOTAL_OF_20))
    assert fake_stripe.deliver(refund).status_code == 409
    assert fake_stripe.deliver(event).status_code == 200
    assert fake_stripe.deliver(refund).status_code == 200
    balance, entries, _ = books(app, account_id)
    assert balance == 0 and len(entries) == 2


def test_events_of_payments_not_ours_are_acknowledged_and_change_nothing(
    app, payments_server, fake_stripe
):
    stranger = {
        "id": "cs_test_other",
        "object": "checkout.session",
        "amount_total": 500,
        "currency": "usd",
        "client_reference_id": None,
        "payment_status": "paid",
    }
    answer = fake_stripe.deliver(fake_stripe.event("checkout.session.completed", stranger))
    assert answer.status_code == 200 and answer.json()["result"] == "ignored"
    other_type = fake_stripe.deliver(fake_stripe.event("customer.created", {"id": "cus_1"}))
    assert other_type.status_code == 200 and other_type.json()["result"] == "ignored"
    with app.app_context():
        recorded = db.session.scalars(
            select(StripeEvent).where(StripeEvent.type == "customer.created")
        ).all()
    assert recorded == []


def test_a_signed_body_that_is_no_event_is_a_400(payments_server, fake_stripe):
    answer = fake_stripe.deliver_raw(b"[]")
    assert answer.status_code == 400
    assert answer.json()["error"]["type"] == "invalid_request_error"
