"""Auto top-up under concurrent settlements: one crossing, one PaymentIntent, one credit.

Two gunicorn workers settle many requests at once while their own sweepers and the
test's (``make_due_topups``, several at once) look for organisations below their
threshold; the local Stripe records every PaymentIntent the gateway asks for.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from threading import Event

import pytest
import requests

from app.accounts.keys import create_key
from app.payments import topups
from app.sweeper import make_due_topups
from tests.conftest import running_server
from tests.payments.conftest import (
    PAYMENTS_ENV,
    PaymentsGateway,
    books,
    intents_for,
    new_account,
    save_card_at_checkout,
)

REQUESTS = 40
SWEEPERS = 4
TOP_UP = Decimal(10)


@pytest.fixture(scope="module")
def two_workers(app, database_url, fake_stripe, tmp_path_factory) -> Iterator[PaymentsGateway]:
    """Two gunicorn workers selling credits, whose sweepers run every second."""
    env = {
        **PAYMENTS_ENV,
        "STRIPE_API_BASE": fake_stripe.url,
        "TOPUP_FEE_PERCENT": "3",
        "WEB_CONCURRENCY": "2",
        # A sweep every second (a quarter of the TTL, at least one second).
        "HOLD_TTL_SECONDS": "4",
    }
    folder = tmp_path_factory.mktemp("topups")
    with running_server(database_url, folder, **env) as server:
        fake_stripe.webhook_url = f"{server.url}/billing/stripe/webhook"
        yield PaymentsGateway(server.url, folder)


def chat(server: PaymentsGateway, key: str) -> requests.Response:
    return requests.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]},
        timeout=60,
    )


def sweep_until(app, done: Event) -> int:
    """Run the sweeper's duty again and again until ``done``; return the payments it made."""
    made = 0
    while not done.wait(0.05):
        made += make_due_topups(app)
    return made


def sweep_at_once(app) -> int:
    with ThreadPoolExecutor(max_workers=SWEEPERS) as pool:
        return sum(pool.map(lambda _: make_due_topups(app), range(SWEEPERS)))


def test_settlements_crossing_the_threshold_at_once_make_one_payment_credited_once(
    sweeping_app, two_workers, fake_stripe
):
    app = sweeping_app
    account_id = new_account(app)
    save_card_at_checkout(app, fake_stripe, account_id)
    with app.app_context():
        key = create_key(account_id=account_id, name="spender").value
    assert chat(two_workers, key).status_code == 200
    balance, _, _ = books(app, account_id)
    price = Decimal(20) - balance
    assert price > 0
    # Half the requests take the balance below the threshold; the others settle after.
    threshold = balance - price * (REQUESTS // 2)
    with app.app_context():
        topups.configure(account_id, enabled=True, threshold=threshold, amount=TOP_UP)
    done = Event()
    with ThreadPoolExecutor(max_workers=REQUESTS + SWEEPERS) as pool:
        sweepers = [pool.submit(sweep_until, app, done) for _ in range(SWEEPERS)]
        answers = list(pool.map(lambda _: chat(two_workers, key), range(REQUESTS)))
        done.set()
        made = sum(sweeper.result() for sweeper in sweepers)
    assert [answer.status_code for answer in answers] == [200] * REQUESTS
    made += sweep_at_once(app)
    spent, _, orders = books(app, account_id)
    assert spent < threshold
    # Whichever sweeper claimed it (the test's or a worker's): one order, one PaymentIntent.
    ((params, headers),) = intents_for(fake_stripe, account_id, app)
    (order,) = [order for order in orders if order.kind == "auto_topup"]
    assert made <= 1 and order.status == "pending"
    assert params["metadata"]["order_id"] == order.id
    assert headers["Idempotency-Key"] == f"topup-{order.id}"
    intent = next(i for i in fake_stripe.intents.values() if i["metadata"] == params["metadata"])
    # Stripe's event, delivered five times at once: one credit.
    event = fake_stripe.event("payment_intent.succeeded", intent)
    with ThreadPoolExecutor(max_workers=5) as pool:
        results = sorted(pool.map(lambda _: fake_stripe.deliver(event).json()["result"], range(5)))
    assert results == ["applied"] + ["duplicate"] * 4
    balance, entries, orders = books(app, account_id)
    assert balance == spent + TOP_UP > threshold
    grants = [e for e in entries if e.idempotency_key == f"order:{order.id}"]
    assert [(grant.kind, grant.amount) for grant in grants] == [("grant", TOP_UP)]
    assert [o.status for o in orders if o.kind == "auto_topup"] == ["paid"]
    # Back above the threshold: armed again, and nothing more to buy.
    assert sweep_at_once(app) == 0
    assert len(intents_for(fake_stripe, account_id, app)) == 1
    with app.app_context():
        assert topups.topup_of(account_id).armed
    audit = app.test_cli_runner().invoke(
        args=["ledger", "audit", "--account", str(account_id), "--full"]
    )
    assert audit.exit_code == 0, audit.output
    assert "0 mismatches" in audit.stdout
