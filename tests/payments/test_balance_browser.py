"""Add credits in a real browser: the Balance page, Checkout (the local Stripe), the order page.

The local Stripe's Checkout page pays at once and sends its buyer back; its webhook
events are held back until the test releases them, so that the order page is seen
pending first, then paid when it reloads itself.
"""

from __future__ import annotations

from decimal import Decimal

from tests.dashboard.conftest import PASSWORD, make_holder
from tests.payments.conftest import books


def sign_in(page, url: str, email: str) -> None:
    page.goto(f"{url}/signin")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="API keys").wait_for()


def test_add_credits_through_checkout_to_a_paid_order(
    app,
    payments_server,
    fake_stripe,
    page,
    artifacts,
):
    account_id, email = make_holder(app, Decimal("5"))
    sign_in(page, payments_server.url, email)
    page.get_by_role("link", name="Balance", exact=True).click()
    page.get_by_text("A fee of 3% is added").wait_for()
    page.get_by_label("Amount (USD)").fill("25")
    fake_stripe.hold_events = True
    try:
        page.get_by_role("button", name="Add credits").click()
        page.get_by_text("Status: pending").wait_for()
        assert "/balance/orders/ord_" in page.url
        page.screenshot(path=str(artifacts / "payments-order-pending.png"))
        _, _, (order,) = books(app, account_id)
        assert order.status == "pending" and order.total_cents == 2575
    finally:
        fake_stripe.hold_events = False
        fake_stripe.release()
    # The order page reloads itself until the webhook's credit is there.
    page.get_by_text("Status: paid").wait_for()
    assert "$30.00" in page.content()
    page.get_by_role("link", name="Back to the balance").click()
    assert page.locator("#balance").inner_text() == "$30.00"
    receipt = page.get_by_role("link", name="Receipt")
    assert receipt.get_attribute("href").startswith(fake_stripe.url + "/receipts/pi_")
    page.screenshot(path=str(artifacts / "payments-balance.png"))
    balance, entries, (order,) = books(app, account_id)
    assert balance == Decimal(30) and order.status == "paid"
    assert entries[-1].description == f"Stripe payment, order {order.id}"
