"""Budgets of keys and members: held in the hold's transaction, windows rolled at their boundary."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select, update

from app import budgets as budget_windows
from app.accounts import budgets
from app.accounts.budgets import set_key_budget, set_member_budget
from app.accounts.keys import create_key
from app.accounts.models import MEMBER, Membership, Person
from app.auth.models import ApiKey
from app.budgets import unix_micros
from app.credits import ledger
from app.extensions import db
from app.generations.audit import audit_ledger
from tests.factories import AccountFactory


class Clock:
    """The ledger's time, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock(datetime(2026, 3, 4, 12, 0, tzinfo=UTC))
    for module in (ledger, budgets):
        monkeypatch.setattr(module, "utcnow", clock)
    return clock


def add_member(account_id: int, email: str) -> int:
    person = Person(email=email)
    db.session.add(person)
    db.session.flush()
    member = Membership(account_id=account_id, person_id=person.id, role=MEMBER)
    db.session.add(member)
    db.session.commit()
    return member.id


def hold(account, key_id, amount: str, hold_id: str | None = None):
    # A generation's hold takes the generation's id, by which the audit finds its charge.
    return ledger.place_hold(
        account_id=account.id,
        amount=Decimal(amount),
        ttl_seconds=3600,
        key_id=key_id,
        hold_id=hold_id,
    )


def spend(account, key_id, amount: str, name: str) -> None:
    name = unique(name)
    held = hold(account, key_id, amount, hold_id=name)
    assert isinstance(held, ledger.HeldCredit), held
    ledger.settle_hold(held, cost=Decimal(amount), generation_id=name)


def unique(name: str) -> str:
    """Return a generation id (and its hold's) no other test has used."""
    return f"{name}-{secrets.token_hex(6)}"


def counters(key_id: int) -> tuple[Decimal, Decimal, int]:
    db.session.expire_all()
    key = db.session.get(ApiKey, key_id)
    return key.window_spent, key.window_reserved, key.window_start


def assert_audit_clean(account_id: int) -> None:
    report = audit_ledger([account_id], full=True)
    assert report.mismatches == []


# (window, a moment just before a boundary, the boundary)
BOUNDARIES = [
    ("day", datetime(2026, 3, 4, 23, 59, 59, 999999, tzinfo=UTC), datetime(2026, 3, 5, tzinfo=UTC)),
    # 2026-03-08 is a Sunday: the week starts on Monday the 9th.
    ("week", datetime(2026, 3, 8, 23, 59, 59, tzinfo=UTC), datetime(2026, 3, 9, tzinfo=UTC)),
    ("month", datetime(2026, 3, 31, 23, 59, 59, tzinfo=UTC), datetime(2026, 4, 1, tzinfo=UTC)),
]


@pytest.mark.parametrize(("window", "before", "boundary"), BOUNDARIES)
def test_a_calendar_window_starts_from_zero_exactly_at_its_boundary(
    app_context, clock, window, before, boundary
):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="budgeted").id
    set_key_budget(key_id, amount=Decimal("1"), window=window)
    clock.now = before - timedelta(days=1 if window != "day" else 0, hours=1)
    spend(account, key_id, "0.6", "g-early")
    clock.now = before
    spend(account, key_id, "0.4", "g-last")
    refused = hold(account, key_id, "0.000001")
    assert isinstance(refused, ledger.BudgetShortfall) and refused.holder == ledger.KEY_BUDGET
    assert refused.window == window and refused.available == 0
    clock.now = boundary
    assert isinstance(hold(account, key_id, "1"), ledger.HeldCredit)
    assert counters(key_id) == (0, Decimal("1"), unix_micros(boundary))
    assert_audit_clean(account.id)


def test_a_five_hour_window_starts_with_the_first_request_after_the_last_ended(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="plan").id
    set_key_budget(key_id, amount=Decimal("1"), window="5h")
    first = datetime(2026, 3, 4, 9, 17, 30, tzinfo=UTC)
    clock.now = first
    spend(account, key_id, "1", "g-first")
    clock.now = first + timedelta(hours=5) - timedelta(microseconds=1)
    assert isinstance(hold(account, key_id, "0.01"), ledger.BudgetShortfall)
    # Nothing is asked at the end: the next window starts with the next request.
    later = first + timedelta(hours=7, minutes=3)
    clock.now = later
    spend(account, key_id, "1", "g-later")
    assert counters(key_id) == (Decimal("1"), 0, unix_micros(later))
    clock.now = later + timedelta(hours=4, minutes=59)
    assert isinstance(hold(account, key_id, "0.01"), ledger.BudgetShortfall)
    assert_audit_clean(account.id)


def test_a_request_in_flight_across_the_boundary_counts_in_the_window_it_was_held_in(
    app_context, clock
):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="crossing").id
    set_key_budget(key_id, amount=Decimal("1"), window="day")
    clock.now = datetime(2026, 3, 4, 23, 59, tzinfo=UTC)
    crossing = hold(account, key_id, "0.5", hold_id=unique("g-crossing"))
    clock.now = datetime(2026, 3, 5, 0, 1, tzinfo=UTC)
    spend(account, key_id, "0.3", "g-new-day")
    ledger.settle_hold(crossing, cost=Decimal("0.4"), generation_id=crossing.id)
    # The new day counts only its own request; the crossing one was the old day's.
    assert counters(key_id)[:2] == (Decimal("0.3"), 0)
    assert isinstance(hold(account, key_id, "0.7"), ledger.HeldCredit)
    assert_audit_clean(account.id)


def test_a_members_budget_counts_all_their_keys_and_names_itself(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    member_id = add_member(account.id, "dev@example.com")
    first = create_key(account_id=account.id, name="one", member_id=member_id).id
    second = create_key(account_id=account.id, name="two", member_id=member_id).id
    set_member_budget(member_id, amount=Decimal("1"), window="week")
    set_key_budget(second, amount=Decimal("5"), window="day")
    spend(account, first, "0.6", "g-one")
    refused = hold(account, second, "0.5")
    assert refused == ledger.BudgetShortfall(
        requested=Decimal("0.5"),
        available=Decimal("0.4"),
        budget=Decimal("1"),
        window="week",
        holder=ledger.MEMBER_BUDGET,
    )
    spend(account, second, "0.4", "g-two")
    db.session.expire_all()
    member = db.session.get(Membership, member_id)
    assert (member.window_spent, member.window_reserved) == (Decimal("1"), 0)
    assert_audit_clean(account.id)


def test_a_charge_beyond_its_hold_stops_at_the_members_budget(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    member_id = add_member(account.id, "over@example.com")
    key_id = create_key(account_id=account.id, name="k", member_id=member_id).id
    set_member_budget(member_id, amount=Decimal("1"), window="month")
    held = hold(account, key_id, "0.5", hold_id=unique("g-over"))
    charged = ledger.settle_hold(held, cost=Decimal("3"), generation_id=held.id)
    assert charged == Decimal("1")
    assert_audit_clean(account.id)


def test_a_budget_whose_window_changes_counts_what_was_spent_in_the_new_window(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="switch").id
    clock.now = datetime(2026, 3, 2, 10, tzinfo=UTC)  # a Monday
    spend(account, key_id, "0.2", "g-monday")
    clock.now = datetime(2026, 3, 4, 10, tzinfo=UTC)
    spend(account, key_id, "0.3", "g-wednesday")
    set_key_budget(key_id, amount=Decimal("1"), window="day")
    assert counters(key_id)[0] == Decimal("0.3")
    set_key_budget(key_id, amount=Decimal("1"), window="week")
    assert counters(key_id)[0] == Decimal("0.5")
    assert_audit_clean(account.id)


def test_the_audit_finds_counters_that_do_not_match_their_holds(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="tampered").id
    spend(account, key_id, "0.2", "g-tampered")
    db.session.execute(update(ApiKey).where(ApiKey.id == key_id).values(window_spent=0))
    member_id = db.session.scalar(select(ApiKey.member_id).where(ApiKey.id == key_id))
    db.session.execute(
        update(Membership).where(Membership.id == member_id).values(window_reserved=1)
    )
    db.session.commit()
    problems = [str(m) for m in audit_ledger([account.id], full=True).mismatches]
    assert problems == [
        f"key {key_id}: spent $0 in its window but its holds were charged $0.2",
        f"member {member_id}: reserved $1 but its open holds sum to $0",
    ]


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 3, 9, 0, 0, tzinfo=UTC),  # a Monday's first instant
        datetime(2026, 3, 8, 23, 59, 59, 999999, tzinfo=UTC),  # a Sunday's last
        datetime(2024, 2, 29, 12, 30, 1, 5, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1970, 1, 1, tzinfo=UTC),  # a Thursday
    ],
)
def test_a_holds_window_starts_are_the_calendars(moment):
    windows = budget_windows.window_parameters(moment)
    assert windows == {
        "day_start": unix_micros(datetime(moment.year, moment.month, moment.day, tzinfo=UTC)),
        "week_start": unix_micros(
            datetime(moment.year, moment.month, moment.day, tzinfo=UTC)
            - timedelta(days=moment.weekday())
        ),
        "month_start": unix_micros(datetime(moment.year, moment.month, 1, tzinfo=UTC)),
        "now_micros": unix_micros(moment),
    }
    assert budget_windows.from_unix_micros(windows["now_micros"]) == moment
