"""A gateway that buys credits from a local Stripe: the fake server, and orders to pay."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import select

from app.credits.models import Account, LedgerEntry
from app.extensions import db
from app.payments import topups
from app.payments.models import PaymentOrder
from app.payments.orders import Quote, place_order
from tests.conftest import running_server
from tests.dashboard.conftest import artifacts, browser, page  # noqa: F401 - the browser's fixtures
from tests.factories import AccountFactory
from tests.stripe_server import SECRET_KEY, WEBHOOK_SECRET, FakeStripe, stripe_serving

PAYMENTS_ENV = {"STRIPE_SECRET_KEY": SECRET_KEY, "STRIPE_WEBHOOK_SECRET": WEBHOOK_SECRET}


@pytest.fixture(scope="module")
def fake_stripe() -> Iterator[FakeStripe]:
    """The local Stripe the gateway's API base points at."""
    with stripe_serving() as fake:
        yield fake


@dataclass(frozen=True)
class PaymentsGateway:
    """A gateway that sells credits: its URL and its log."""

    url: str
    folder: Path

    def log(self) -> str:
        """Return what gunicorn logged so far."""
        return "".join(path.read_text() for path in self.folder.glob("gunicorn-*.log"))


@pytest.fixture(scope="module")
def payments_server(app, database_url, fake_stripe, tmp_path_factory) -> Iterator[PaymentsGateway]:
    """Gunicorn with Stripe set up against ``fake_stripe`` (3% fee), which delivers to it."""
    env = {**PAYMENTS_ENV, "STRIPE_API_BASE": fake_stripe.url, "TOPUP_FEE_PERCENT": "3"}
    folder = tmp_path_factory.mktemp("payments")
    with running_server(database_url, folder, **env) as server:
        fake_stripe.webhook_url = f"{server.url}/billing/stripe/webhook"
        yield PaymentsGateway(server.url, folder)


def new_account(app, credits: Decimal = Decimal(0)) -> int:
    """Make an account with ``credits``; return its id."""
    with app.app_context():
        return AccountFactory.create(credits=credits).id


def checkout_order(app, fake: FakeStripe, account_id: int, amount: str = "20.00") -> dict:
    """Place a pending order of ``amount`` (3% fee) and its Checkout session in the fake.

    Return the session as the fake keeps it (client_reference_id = the order's id).
    """
    usd = Decimal(amount)
    fee = (usd * 3 / 100).quantize(Decimal("0.01"))
    with app.app_context():
        order = place_order(account_id, Quote(amount=usd, fee=fee))
        order_id, total = order.id, order.total_cents
    session = {
        "id": f"cs_test_{order_id}",
        "object": "checkout.session",
        "amount_total": total,
        "currency": "usd",
        "client_reference_id": order_id,
        "mode": "payment",
        "payment_intent": None,
        "payment_intent_data": {"metadata": {"order_id": order_id}},
        "payment_status": "unpaid",
        "status": "open",
        "metadata": {"order_id": order_id},
        "success_url": "http://127.0.0.1/balance",
    }
    fake.sessions[session["id"]] = session
    return session


def books(app, account_id: int) -> tuple[Decimal, list[LedgerEntry], list[PaymentOrder]]:
    """Return the balance, ledger entries and orders of the account, as stored."""
    with app.app_context():
        db.session.expire_all()
        balance = db.session.get(Account, account_id).balance
        entries = db.session.scalars(
            select(LedgerEntry).where(LedgerEntry.account_id == account_id).order_by(LedgerEntry.id)
        ).all()
        orders = db.session.scalars(
            select(PaymentOrder).where(PaymentOrder.account_id == account_id)
        ).all()
        # Detached with what was read: the caller reads them outside this context.
        db.session.expunge_all()
        return balance, list(entries), list(orders)


@pytest.fixture
def sweeping_app(app, fake_stripe):
    """The in-process app (whose duty the test runs) set up with the local Stripe, 3% fee."""
    settings = {
        "STRIPE_SECRET_KEY": SECRET_KEY,
        "STRIPE_API_BASE": fake_stripe.url,
        "TOPUP_FEE_PERCENT": Decimal(3),
    }
    before = {name: app.config[name] for name in settings}
    app.config.update(settings)
    yield app
    app.config.update(before)


def save_card_at_checkout(app, fake, account_id: int) -> None:
    """Pay a $20 Checkout order whose card is saved for off-session use."""
    session = checkout_order(app, fake, account_id)
    session["payment_intent_data"]["setup_future_usage"] = "off_session"
    session["payment_intent_data"]["metadata"]["save_card"] = "true"
    session, charge = fake.pay(session["id"])
    public = {k: v for k, v in session.items() if k != "payment_intent_data"}
    assert fake.deliver(fake.event("checkout.session.completed", public)).ok
    assert fake.deliver(fake.event("charge.succeeded", charge)).ok


def run_sweepers(app, workers: int = 8) -> int:
    """Run the auto top-up's sweep in ``workers`` threads at once; return the payments made."""

    def sweep(_):
        with app.app_context():
            return topups.top_up_where_due()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return sum(pool.map(sweep, range(workers)))


def intents_for(fake, account_id: int, app) -> list[tuple[dict, dict]]:
    """Return the PaymentIntents the gateway asked the fake for the account's orders."""
    _, _, orders = books(app, account_id)
    ids = {order.id for order in orders}
    return [
        (params, headers)
        for method, path, params, headers in fake.requests
        if path == "/v1/payment_intents" and params["metadata"]["order_id"] in ids
    ]
