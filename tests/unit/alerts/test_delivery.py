"""Balance alerts: written by the settlement that crosses, signed, retried, logged, mailed."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from datetime import timedelta
from decimal import Decimal

from sqlalchemy import select

from app.alerts import delivery
from app.alerts.delivery import deliver_alerts, deliver_due
from app.alerts.endpoints import add_email, add_webhook, delivery_log, set_balance_threshold
from app.alerts.models import DELIVERED, FAILED, AlertEvent
from app.credits import grants, holds, settlement
from app.database import utcnow
from app.extensions import db
from tests.alert_receiver import trickling_receiver, webhook_receiver
from tests.conftest import ROOT
from tests.factories import AccountFactory


def spend(account_id: int, cost: str, name: str) -> None:
    """Charge ``cost`` through a hold and its settlement, as a request is charged."""
    held = holds.place_hold(account_id=account_id, amount=Decimal(cost), ttl_seconds=60)
    settlement.settle_hold(held, cost=Decimal(cost), generation_id=f"{name}-{account_id}")


def events_of(account_id: int) -> list[AlertEvent]:
    db.session.expire_all()
    return list(db.session.scalars(select(AlertEvent).where(AlertEvent.account_id == account_id)))


def test_one_event_per_crossing_and_a_grant_rearms(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    spend(account.id, "4", "above")
    assert events_of(account.id) == []
    spend(account.id, "2", "across")
    spend(account.id, "1", "below")
    [event] = events_of(account.id)
    assert event.type == "balance.below_threshold"
    grants.grant_credits(account_id=account.id, amount=Decimal("0.5"))
    spend(account.id, "0.2", "still-below")
    assert len(events_of(account.id)) == 1
    grants.grant_credits(account_id=account.id, amount=Decimal("10"))
    spend(account.id, "9", "again")
    assert len(events_of(account.id)) == 2


def test_a_threshold_set_above_the_balance_alerts_at_once_and_once(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("10"))
    assert events_of(account.id) == []
    set_balance_threshold(account.id, Decimal("12"))
    [event] = events_of(account.id)
    assert event.type == "balance.below_threshold"
    set_balance_threshold(account.id, Decimal("15"))
    spend(account.id, "1", "further-below")
    assert len(events_of(account.id)) == 1


def test_a_cleared_threshold_alerts_nobody(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    set_balance_threshold(account.id, None)
    spend(account.id, "9", "cleared")
    assert events_of(account.id) == []


def test_a_signed_webhook_is_delivered_once(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    with webhook_receiver() as receiver:
        endpoint, receiver.secret = add_webhook(account.id, receiver.url)
        spend(account.id, "6", "signed")
        deliver_alerts()
        deliver_alerts()
    assert receiver.bad_signatures == 0
    [event] = receiver.events
    assert event["type"] == "balance.below_threshold"
    assert event["data"] == {"organisation_id": account.id, "threshold": "5", "balance": "4"}
    assert event["id"].startswith("evt_") and isinstance(event["created"], int)
    [line] = delivery_log(account.id)
    assert (line.delivery.status, line.delivery.attempts, line.endpoint.id) == (
        DELIVERED,
        1,
        endpoint.id,
    )


def test_a_failing_receiver_is_retried_with_growing_delays(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    with webhook_receiver(answers=[500, 500, 503]) as receiver:
        _, receiver.secret = add_webhook(account.id, receiver.url)
        spend(account.id, "6", "retried")
        start = utcnow()
        deliver_alerts(start)
        [line] = delivery_log(account.id)
        assert (line.delivery.attempts, line.delivery.last_status) == (1, 500)
        assert line.delivery.next_attempt_at == start + timedelta(seconds=10)
        deliver_due(start + timedelta(seconds=9))
        assert receiver.posts == 1
        deliver_due(start + timedelta(seconds=10))
        assert receiver.posts == 2
        deliver_due(start + timedelta(seconds=29))
        assert receiver.posts == 2
        deliver_due(start + timedelta(seconds=30))
        deliver_due(start + timedelta(seconds=70))
    db.session.expire_all()
    [line] = delivery_log(account.id)
    assert receiver.posts == 4 and len(receiver.events) == 1
    assert (line.delivery.status, line.delivery.attempts, line.delivery.last_status) == (
        DELIVERED,
        4,
        200,
    )


def test_a_receiver_failing_for_a_day_is_given_up(app_context):
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    with webhook_receiver(answers=[500] * 100) as receiver:
        _, receiver.secret = add_webhook(account.id, receiver.url)
        spend(account.id, "6", "given-up")
        moment = utcnow()
        deliver_alerts(moment)
        while (line := delivery_log(account.id)[0]).delivery.status not in (FAILED, DELIVERED):
            moment = line.delivery.next_attempt_at
            deliver_due(moment)
    assert line.delivery.status == FAILED
    assert moment - line.delivery.created_at < timedelta(hours=24)
    assert 20 < line.delivery.attempts == receiver.posts < 40


def test_an_alert_is_mailed_through_smtp_url(app_context, smtp_server, monkeypatch):
    received, url = smtp_server
    monkeypatch.setitem(app_context.config, "SMTP_URL", url)
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    add_email(account.id, "billing@example.com")
    spend(account.id, "7", "mailed")
    deliver_alerts()
    [message] = received
    assert message["To"] == "billing@example.com"
    assert message["Subject"] == "Balance below $5"
    assert "fell to $3, below its alert threshold of $5" in message.get_payload()
    [line] = delivery_log(account.id)
    assert (line.delivery.status, line.delivery.attempts) == (DELIVERED, 1)


def test_mail_that_cannot_be_sent_is_retried(app_context, monkeypatch):
    monkeypatch.setitem(app_context.config, "SMTP_URL", None)
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    add_email(account.id, "billing@example.com")
    spend(account.id, "7", "unmailed")
    deliver_alerts()
    [line] = delivery_log(account.id)
    assert (line.delivery.status, line.delivery.attempts) == ("pending", 1)
    assert "SMTP_URL is not set" in line.delivery.last_error


def test_a_secret_sealed_under_another_secret_key_fails_the_try_not_the_deliverer(
    app_context, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    with webhook_receiver() as receiver:
        _, receiver.secret = add_webhook(account.id, receiver.url)
        monkeypatch.setitem(app_context.config, "SECRET_KEY", "another-secret-key")
        spend(account.id, "6", "rekeyed")
        deliver_alerts()
    [line] = delivery_log(account.id)
    assert receiver.posts == 0
    assert (line.delivery.status, line.delivery.attempts) == ("pending", 1)
    assert "SECRET_KEY changed" in line.delivery.last_error


# A webhook's try as a worker's alert deliverer makes it: sockets patched by gevent.
TRY_IN_A_WORKER = """
from gevent import monkey

monkey.patch_all()

import sys
from datetime import UTC, datetime

from app import create_app
from app.alerts import delivery
from app.alerts.models import AlertEvent

delivery.WEBHOOK_DEADLINE_SECONDS = 1
settings = {"SQLALCHEMY_DATABASE_URI": sys.argv[2], "ALERT_WEBHOOK_NETWORKS": "127.0.0.0/8"}
app = create_app("testing", settings)
event = AlertEvent(id=1, type="balance.below_threshold", data="{}", created=0)
with app.app_context():
    try:
        print("delivered", delivery.post_webhook(sys.argv[1], "secret", event, datetime.now(UTC)))
    except delivery.DeliveryFailed as failed:
        print("failed:", failed.reason)
"""


def test_a_receiver_that_trickles_its_answer_fails_the_try_at_its_deadline(tmp_path):
    database = f"sqlite:///{tmp_path / 'unused.sqlite3'}"
    with trickling_receiver(seconds=20) as url:
        tried = subprocess.run(
            [sys.executable, "-c", TRY_IN_A_WORKER, url, database],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert tried.returncode == 0, tried.stderr[-2000:]
    assert tried.stdout.strip() == "failed: no answer within 1 s"


class SlowClock:
    """The deliverer's clock, which each slow receiver moves on while it answers."""

    def __init__(self) -> None:
        self.moment = utcnow()
        self.lock = threading.Lock()

    def now(self):
        with self.lock:
            return self.moment

    def wait(self, seconds: float) -> None:
        with self.lock:
            self.moment += timedelta(seconds=seconds)


def test_a_delivery_taken_late_in_a_long_pass_is_not_sent_by_another_worker(
    app_context, monkeypatch
):
    """Each receiver takes 90 s to answer: the pass reaches the third past one lease (2 min).

    While the first worker waits for the third answer, a second worker's pass runs: the
    third delivery is leased from the moment it was taken, so it is not due again.
    """
    clock = SlowClock()
    monkeypatch.setattr(delivery, "utcnow", clock.now)
    third_arrived, answer_third = threading.Event(), threading.Event()
    posts = []

    def slow_answer() -> None:
        posts.append(clock.now())
        if len(posts) == 3:
            third_arrived.set()
            assert answer_third.wait(30)
        clock.wait(90)

    account = AccountFactory.create(credits=Decimal("10"))
    set_balance_threshold(account.id, Decimal("5"))
    with contextlib.ExitStack() as stack:
        receivers = [
            stack.enter_context(webhook_receiver(before_answer=slow_answer)) for _ in range(3)
        ]
        for receiver in receivers:
            _, receiver.secret = add_webhook(account.id, receiver.url)
        spend(account.id, "6", "slow-pass")
        first = threading.Thread(target=pass_in_another_worker, args=(app_context,))
        first.start()
        assert third_arrived.wait(30), "the first worker's pass never reached its third try"
        deliver_alerts()
        answer_third.set()
        first.join(timeout=30)

    assert [receiver.posts for receiver in receivers] == [1, 1, 1]
    assert all(receiver.bad_signatures == 0 for receiver in receivers)
    # Each try signed, and was recorded delivered, at its own moment.
    signed = sorted(t for receiver in receivers for t in receiver.signed_at)
    assert signed == [int(moment.timestamp()) for moment in posts]
    db.session.expire_all()
    delivered = sorted(line.delivery.delivered_at for line in delivery_log(account.id))
    assert delivered == [posts[0] + timedelta(seconds=90 * n) for n in (1, 2, 3)]


def pass_in_another_worker(app) -> None:
    with app.app_context():
        deliver_alerts()
