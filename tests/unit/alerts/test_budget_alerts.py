"""Budget alerts: at the organisation's share of a window's budget (80% unless set) and at 100%."""

from __future__ import annotations

import json
from decimal import Decimal

from sqlalchemy import select, update

from app.accounts.budgets import set_key_budget, set_member_budget
from app.alerts.endpoints import set_budget_alert_percent
from app.alerts.events import event_text
from app.alerts.models import AlertEvent
from app.auth.models import ApiKey
from app.credits import holds, settlement
from app.extensions import db
from tests.factories import AccountFactory


def spend(account_id: int, key_id: int, cost: str, name: str, hold: str | None = None) -> None:
    """Charge ``cost`` on the key through a hold (of ``cost`` unless given) and its settlement."""
    held = holds.place_hold(
        account_id=account_id, amount=Decimal(hold or cost), ttl_seconds=60, key_id=key_id
    )
    settlement.settle_hold(held, cost=Decimal(cost), generation_id=f"{name}-{key_id}")


def events(account_id: int) -> list[tuple[str, dict]]:
    db.session.expire_all()
    rows = db.session.scalars(
        select(AlertEvent).where(AlertEvent.account_id == account_id).order_by(AlertEvent.id)
    )
    return [(event.type, json.loads(event.data)) for event in rows]


def test_a_key_budget_alerts_at_80_percent_and_when_used_up_once_a_window(app_context):
    account, key = AccountFactory.with_key(credits=Decimal("100"))
    set_key_budget(key.id, amount=Decimal("10"), window="day")
    spend(account.id, key.id, "7", "under")
    assert events(account.id) == []
    spend(account.id, key.id, "1.5", "at-85")
    spend(account.id, key.id, "0.5", "at-90")
    [(kind, data)] = events(account.id)
    assert kind == "budget.threshold_reached"
    assert data["key_id"] == key.id and data["percent"] == 80 and data["window"] == "day"
    spend(account.id, key.id, "5", "past", hold="0.5")
    assert [kind for kind, _ in events(account.id)] == [
        "budget.threshold_reached",
        "budget.exhausted",
    ]
    subject, _ = event_text(
        db.session.scalars(select(AlertEvent).order_by(AlertEvent.id.desc())).first()
    )
    assert subject == f"Budget of key {key.id} used up"
    # A new window starts from nothing spent: its crossings alert again.
    db.session.execute(
        update(ApiKey).where(ApiKey.id == key.id).values(window_start=ApiKey.window_start - 1)
    )
    db.session.commit()
    spend(account.id, key.id, "9", "next-window")
    assert len(events(account.id)) == 3


def test_a_member_budget_alerts_too(app_context):
    account, key = AccountFactory.with_key(credits=Decimal("100"))
    member_id = db.session.scalar(select(ApiKey.member_id).where(ApiKey.id == key.id))
    set_member_budget(member_id, amount=Decimal("1"), window="week")
    spend(account.id, key.id, "1", "member")
    # Both crossed by one charge: written by one UPDATE, in no particular order.
    kinds = sorted((kind, data.get("member_id")) for kind, data in events(account.id))
    assert kinds == [
        ("budget.exhausted", member_id),
        ("budget.threshold_reached", member_id),
    ]


def test_the_organisations_percentage_decides_the_early_alert(app_context):
    account, key = AccountFactory.with_key(credits=Decimal("100"))
    set_budget_alert_percent(account.id, 50)
    set_key_budget(key.id, amount=Decimal("10"), window="day")
    spend(account.id, key.id, "4.99", "under")
    assert events(account.id) == []
    spend(account.id, key.id, "0.01", "at-50")
    [(kind, data)] = events(account.id)
    assert kind == "budget.threshold_reached" and data["percent"] == 50
    spend(account.id, key.id, "3", "at-80")
    assert len(events(account.id)) == 1


def test_without_a_percentage_only_a_used_up_budget_alerts(app_context):
    account, key = AccountFactory.with_key(credits=Decimal("100"))
    set_budget_alert_percent(account.id, None)
    set_key_budget(key.id, amount=Decimal("10"), window="day")
    spend(account.id, key.id, "9", "at-90")
    assert events(account.id) == []
    spend(account.id, key.id, "1", "used-up")
    assert [kind for kind, _ in events(account.id)] == ["budget.exhausted"]


def test_each_organisation_has_its_own_percentage(app_context):
    early, early_key = AccountFactory.with_key(credits=Decimal("100"))
    late, late_key = AccountFactory.with_key(credits=Decimal("100"))
    set_budget_alert_percent(early.id, 10)
    for account, key in ((early, early_key), (late, late_key)):
        set_key_budget(key.id, amount=Decimal("10"), window="day")
        spend(account.id, key.id, "2", "twenty")
    assert [data["percent"] for _, data in events(early.id)] == [10]
    assert events(late.id) == []
