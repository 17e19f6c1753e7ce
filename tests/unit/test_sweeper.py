"""The sweeper renews the holds of running requests and only theirs."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from sqlalchemy import select

from app import sweeper
from app.credits.expiry import expired_holds_with_progress, extend_holds
from app.credits.holds import place_hold
from app.credits.models import Account, Hold, LedgerEntry
from app.credits.settlement import settle_hold
from app.database import utcnow
from app.extensions import db
from app.generations.audit import audit_ledger
from app.generations.live import live_holds
from app.generations.models import Generation
from app.sweeper import (
    LiveHolds,
    record_stream_progress,
    renew_live_holds,
    sweep_expired_holds,
)
from tests.factories import AccountFactory


class Request:
    """Stands for a running request's object."""


def expiry(hold_id):
    db.session.expire_all()
    return db.session.get(Hold, hold_id).expires_at


def test_renewal_pushes_only_the_live_open_holds_forward(app):
    with app.app_context():
        account = AccountFactory.create(credits=Decimal("1"))
        live = place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=1)
        idle = place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=1)
        settled = place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=1)
        settle_hold(settled, cost=Decimal("0.01"), generation_id="g-sweeper-1")
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


SLOW = {"model": "dev-slow", "messages": [{"role": "user", "content": "one two three four five"}]}


def open_stream(app, key: str):
    """Start a stream in-process and pull its first events; return the response."""
    response = app.test_client().post(
        "/v1/chat/completions",
        json={**SLOW, "stream": True},
        headers={"Authorization": f"Bearer {key}"},
        buffered=False,
    )
    events = response.iter_encoded()
    delivered = next(events) + next(events) + next(events)
    assert delivered.count(b'"content"') >= 2
    return response


def running_generation():
    """The one generation this process is streaming, as its sweeper sees it."""
    (hold_id, generation), *others = live_holds.owners()
    assert not others
    return hold_id, generation


def hold_row(app, hold_id):
    with app.app_context():
        hold = db.session.get(Hold, hold_id)
        db.session.expunge(hold)
        db.session.commit()
        return hold


def test_a_streams_progress_is_recorded_only_when_it_delivered_more(app, funded_key):
    response = open_stream(app, funded_key.key)
    hold_id, generation = running_generation()

    assert record_stream_progress(app) == 1
    first = hold_row(app, hold_id).progress
    assert record_stream_progress(app) == 0, "nothing delivered since"
    assert first["completion_tokens"] >= 2 and first["status"] == "interrupted"
    assert first["model"] == "dev-slow" and first["estimated"] is True
    assert Decimal(first["price_completion"]) == Decimal("1.5")

    response.close()
    assert hold_row(app, hold_id).status == "settled"
    assert live_holds.owners() == []


def test_a_stream_whose_worker_died_is_charged_its_last_recorded_progress(app, funded_key):
    response = open_stream(app, funded_key.key)
    hold_id, generation = running_generation()
    assert record_stream_progress(app) == 1
    recorded = hold_row(app, hold_id).progress
    # The worker dies: the stream neither settles nor renews its hold, which expires.
    generation.settled = True
    live_holds.forget(hold_id)
    response.close()
    with app.app_context():
        extend_holds([hold_id], ttl_seconds=-1)

    assert sweep_expired_holds(app) >= 1

    with app.app_context():
        record = db.session.get(Generation, hold_id)
        charge = db.session.scalar(
            select(LedgerEntry.amount).where(LedgerEntry.generation_id == hold_id)
        )
        account = db.session.get(Account, funded_key.account_id)
        assert record.status == "interrupted" and record.estimated
        # Recorded mid-generation: what went out after the record is unknown, so the
        # output is charged at the request's limit, never below what was recorded.
        assert recorded["ended"] is False and recorded["completion_tokens"] > 0
        assert record.completion_tokens == recorded["limits"]["completion_tokens"]
        assert record.completion_tokens > recorded["completion_tokens"]
        assert record.request_id == response.headers["X-Request-Id"]
        assert record.cost > 0 and charge == -record.cost
        assert account.reserved == 0 and account.balance == Decimal("10") - record.cost
        report = audit_ledger([funded_key.account_id])
        assert f"generation {hold_id}" in {e.subject for e in report.estimated}
        db.session.commit()


def test_a_hold_without_progress_is_released_as_before(app):
    with app.app_context():
        account = AccountFactory.create(credits=Decimal("1"))
        held = place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=-1)

    assert sweep_expired_holds(app) >= 1

    assert hold_row(app, held.id).status == "expired"
    with app.app_context():
        assert db.session.get(Generation, held.id) is None
        assert db.session.get(Account, account.id).reserved == 0


def test_a_stream_settled_by_another_workers_sweeper_is_left_to_it(app, funded_key, monkeypatch):
    """Two workers' sweepers read the same expired hold; the slower one settles nothing."""
    response = open_stream(app, funded_key.key)
    hold_id, generation = running_generation()
    assert record_stream_progress(app) == 1
    generation.settled = True
    live_holds.forget(hold_id)
    response.close()
    with app.app_context():
        extend_holds([hold_id], ttl_seconds=-1)
        read_by_both = expired_holds_with_progress()
    assert hold_id in {hold.id for hold, _ in read_by_both}
    sweep_expired_holds(app)
    # The other sweeper read the hold before this one settled it.
    monkeypatch.setattr(sweeper, "expired_holds_with_progress", lambda: read_by_both)

    assert sweep_expired_holds(app) == 0

    with app.app_context():
        charges = db.session.scalars(
            select(LedgerEntry.amount).where(LedgerEntry.generation_id == hold_id)
        ).all()
        assert len(charges) == 1
        db.session.commit()


def test_a_duty_that_fails_unexpectedly_does_not_end_the_loop_that_runs_it(app):
    """A worker has one loop of each kind: an error must not end its renewals for good."""
    done = []

    def broken(app):
        raise RuntimeError("unexpected")

    sweeper.run_duties(app, (broken, done.append, broken, done.append))

    assert done == [app, app]
