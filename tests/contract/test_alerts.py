"""A balance alert over the running service: 50 racing requests cross the threshold once.

The receiver checks each delivery's signature; the workers' background deliverers send
the event; however the requests interleave, one event is written and delivered.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import requests
from sqlalchemy import select

from app.accounts.keys import create_key
from app.alerts.endpoints import add_webhook, delivery_log, set_balance_threshold
from app.alerts.models import DELIVERED, AlertEvent
from app.credits.models import Account
from app.extensions import db
from tests.alert_receiver import webhook_receiver
from tests.conftest import running_server
from tests.factories import AccountFactory

REQUESTS = 50
# A request of dev-chat-mini with 40 completion tokens is charged about $0.00001: the
# 50 spend about $0.0005 and cross the threshold about halfway.
BALANCE = Decimal("0.001")
THRESHOLD = Decimal("0.00075")


def ask(url: str, key: str, index: int) -> int:
    """Send one request; return its status."""
    return requests.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "dev-chat-mini",
            "messages": [{"role": "user", "content": f"alert race {index}"}],
            "max_tokens": 40,
        },
        timeout=60,
    ).status_code


def wait_for(condition, seconds: float = 30) -> None:
    """Wait until ``condition()`` holds (the deliverers poll every few seconds)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)


def test_racing_requests_cross_the_threshold_once(app, database_url, tmp_path):
    with app.app_context():
        account_id = AccountFactory.create(credits=BALANCE).id
        key_value = create_key(account_id=account_id, name="alerts").value
        set_balance_threshold(account_id, THRESHOLD)
    with webhook_receiver() as receiver:
        with app.app_context():
            _, receiver.secret = add_webhook(account_id, receiver.url)
        with running_server(database_url, tmp_path, WEB_CONCURRENCY="2") as server:
            with ThreadPoolExecutor(REQUESTS) as pool:
                statuses = list(pool.map(lambda n: ask(server.url, key_value, n), range(REQUESTS)))
            wait_for(lambda: receiver.events)
            # A second event, were one written, would be sent in the same pass or the next.
            time.sleep(5)
    assert statuses == [200] * REQUESTS
    assert receiver.bad_signatures == 0
    [event] = receiver.events
    assert event["type"] == "balance.below_threshold"
    assert event["data"]["organisation_id"] == account_id
    assert Decimal(event["data"]["balance"]) < THRESHOLD
    assert Decimal(event["data"]["threshold"]) == THRESHOLD
    with app.app_context():
        balance = db.session.scalar(select(Account.balance).where(Account.id == account_id))
        assert balance < THRESHOLD
        written = db.session.scalars(
            select(AlertEvent).where(AlertEvent.account_id == account_id)
        ).all()
        assert len(written) == 1
        [line] = delivery_log(account_id)
        assert (line.delivery.status, line.delivery.attempts) == (DELIVERED, 1)
