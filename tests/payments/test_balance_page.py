"""The Balance page: members see the balance; owners and admins buy credits and redeem codes.

Forms through Werkzeug's client for the rules; a real browser against gunicorn and the
local Stripe for Add credits through to a paid order.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import pytest

from app.database import write_transaction
from app.payments.codes import create_codes
from app.payments.topups import save_card
from tests.dashboard.conftest import (
    make_holder,
    new_client,
    post_form,
    sign_in,
)
from tests.payments.conftest import books
from tests.stripe_server import SECRET_KEY


@pytest.fixture
def stripe_configured(app, fake_stripe) -> Iterator[None]:
    """The in-process app set up to sell credits through the local Stripe (3% fee)."""
    settings = {
        "STRIPE_SECRET_KEY": SECRET_KEY,
        "STRIPE_API_BASE": fake_stripe.url,
        "TOPUP_FEE_PERCENT": Decimal(3),
    }
    before = {name: app.config[name] for name in settings}
    app.config.update(settings)
    yield
    app.config.update(before)


def test_without_stripe_the_page_says_buying_is_not_set_up(app):
    _, email = make_holder(app)
    client = new_client(app)
    sign_in(client, email)
    page = client.get("/balance").text
    assert "Buying credits is not set up" in page and "Add credits</button>" not in page
    refused = post_form(client, "/balance", "/balance/credits", {"amount": "20"})
    assert refused.status_code == 409


def test_an_owner_buys_within_the_bounds_through_checkout(app, stripe_configured, fake_stripe):
    account_id, email = make_holder(app)
    client = new_client(app)
    sign_in(client, email)
    page = client.get("/balance")
    assert "A fee of 3% is added" in page.text and "$5.00" in page.text
    assert fake_stripe.url in page.headers["Content-Security-Policy"]
    for amount in ("4.99", "10000.01", "twenty", "5.001"):
        refused = post_form(client, "/balance", "/balance/credits", {"amount": amount})
        assert refused.status_code == 400, amount
    sent = post_form(client, "/balance", "/balance/credits", {"amount": "20"})
    assert sent.status_code == 303
    session_id = sent.headers["Location"].rsplit("/", 1)[1]
    method, path, params, headers = next(
        r
        for r in fake_stripe.requests
        if r[1] == "/v1/checkout/sessions"
        and r[2]["client_reference_id"] == fake_stripe.sessions[session_id]["client_reference_id"]
    )
    _, _, (order,) = books(app, account_id)
    assert params["mode"] == "payment" and params["client_reference_id"] == order.id
    assert [item["price_data"]["unit_amount"] for item in params["line_items"]] == ["2000", "60"]
    assert params["payment_intent_data"]["metadata"]["order_id"] == order.id
    assert headers["Idempotency-Key"] == f"checkout-{order.id}"
    assert order.status == "pending" and order.checkout_session_id == session_id
    status = client.get(f"/balance/orders/{order.id}")
    assert "Status: pending" in status.text and status.headers["Refresh"] == "2"


def test_codes_are_redeemed_once_and_not_after_they_expire(app):
    account_id, email = make_holder(app, Decimal(0))
    client = new_client(app)
    sign_in(client, email)
    with app.app_context():
        (code,) = create_codes(Decimal("12.5"))
    redeemed = post_form(client, "/balance", "/balance/redeem", {"code": code})
    assert redeemed.status_code == 303
    again = post_form(client, "/balance", "/balance/redeem", {"code": code})
    assert again.status_code == 400 and "redeemed already" in again.text
    wrong = post_form(client, "/balance", "/balance/redeem", {"code": "gc_nothing"})
    assert wrong.status_code == 400 and "not valid" in wrong.text
    balance, entries, _ = books(app, account_id)
    code_id = code.split("_")[1]
    assert balance == Decimal("12.5")
    assert [(e.amount, e.description) for e in entries] == [
        (Decimal("12.5"), f"redemption code gc_{code_id}")
    ]
    assert code not in client.get("/balance").text
    assert f"gc_{code_id}" in client.get("/balance").text


def test_the_payments_export_lists_codes_redeemed(app):
    account_id, email = make_holder(app, Decimal(0))
    client = new_client(app)
    sign_in(client, email)
    with app.app_context():
        (code,) = create_codes(Decimal("2"))
    post_form(client, "/balance", "/balance/redeem", {"code": code})
    assert "Export CSV" in client.get("/balance").text
    export = client.get("/balance/payments.csv")
    assert export.mimetype == "text/csv"
    header, line = export.text.strip().split("\r\n")
    assert header == "time,organisation,kind,reference,amount_usd,fee_usd,status,receipt"
    assert line.split(",")[2:] == ["code", f"gc_{code.split('_')[1]}", "2", "0", "redeemed", ""]


def test_a_checkout_stripe_refuses_fails_its_order_and_says_so(app, stripe_configured):
    app.config["STRIPE_SECRET_KEY"] = "sk_test_not_the_fakes"
    account_id, email = make_holder(app)
    client = new_client(app)
    sign_in(client, email)
    refused = post_form(client, "/balance", "/balance/credits", {"amount": "20"})
    assert refused.status_code == 502
    assert "Stripe could not start the payment; nothing was charged" in refused.text
    _, _, (order,) = books(app, account_id)
    assert order.status == "failed" and order.checkout_session_id is None


def test_the_webhook_without_its_secret_is_not_set_up(client):
    answer = client.post("/billing/stripe/webhook", data=b"{}")
    assert answer.status_code == 503
    assert answer.json["error"]["code"] == "webhook_not_configured"


def test_the_card_is_saved_at_checkout_and_auto_top_up_set_on_the_page(
    app, stripe_configured, fake_stripe
):
    account_id, email = make_holder(app)
    client = new_client(app)
    sign_in(client, email)
    assert "No card saved" in client.get("/balance").text
    sent = post_form(client, "/balance", "/balance/credits", {"amount": "20", "save_card": "y"})
    session_id = sent.headers["Location"].rsplit("/", 1)[1]
    params = next(
        r[2]
        for r in fake_stripe.requests
        if r[1] == "/v1/checkout/sessions"
        and r[2]["client_reference_id"] == fake_stripe.sessions[session_id]["client_reference_id"]
    )
    assert params["customer_creation"] == "always"
    assert params["payment_intent_data"]["setup_future_usage"] == "off_session"
    settings = {"threshold": "5", "amount": "10", "enabled": "y"}
    refused = post_form(client, "/balance", "/balance/auto-topup", settings)
    assert refused.status_code == 400 and "Save a card first" in refused.text
    with app.app_context():
        write_transaction(lambda c: save_card(c, account_id, "cus_test", "pm_card_visa"))
    saved = post_form(client, "/balance", "/balance/auto-topup", settings)
    assert saved.status_code == 303
    page = client.get("/balance").text
    assert "On: when the balance falls below $5.00, $10.00 of credits are bought" in page
    too_small = post_form(client, "/balance", "/balance/auto-topup", {**settings, "amount": "1"})
    assert too_small.status_code == 400 and "between $5.00 and $10000.00" in too_small.text
