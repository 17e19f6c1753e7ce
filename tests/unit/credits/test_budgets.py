"""Budgets of keys and members: held in the hold's transaction, windows rolled at their boundary."""

from __future__ import annotations

import secrets
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select, text, update

from app import budgets as budget_windows
from app.accounts import budgets
from app.accounts.budgets import set_key_budget, set_member_budget
from app.accounts.keys import create_key
from app.accounts.models import MEMBER, Membership, Person
from app.auth.models import ApiKey
from app.budgets import unix_micros
from app.credits import balances, entries, expiry, holds, settlement
from app.credits.models import Hold
from app.credits.sql import guards
from app.credits.sql import holds as hold_sql
from app.extensions import db
from app.generations.audit import audit_ledger
from tests.factories import AccountFactory


class Clock:
    """The ledger's time, moved by the test."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(autouse=True)
def forgotten_keys(monkeypatch):
    """Each test starts from a process that remembers no key's hold shape.

    The process remembers keys by id, and another test's database (SQLite's, before
    PostgreSQL's in one run) may have had a budget on a key of the same id: the hold
    would then take the budgeted shape, and lock or write rows this test says it does not.
    """
    monkeypatch.setattr(holds, "_keys_reserved_on", holds._KeysReservedOn())


@pytest.fixture
def clock(monkeypatch):
    clock = Clock(datetime(2026, 3, 4, 12, 0, tzinfo=UTC))
    for module in (balances, entries, expiry, holds, settlement, budgets):
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
    return holds.place_hold(
        account_id=account.id,
        amount=Decimal(amount),
        ttl_seconds=3600,
        key_id=key_id,
        hold_id=hold_id,
    )


def spend(account, key_id, amount: str, name: str) -> None:
    name = unique(name)
    held = hold(account, key_id, amount, hold_id=name)
    assert isinstance(held, balances.HeldCredit), held
    settlement.settle_hold(held, cost=Decimal(amount), generation_id=name)


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
    assert isinstance(refused, balances.BudgetShortfall) and refused.holder == balances.KEY_BUDGET
    assert refused.window == window and refused.available == 0
    clock.now = boundary
    assert isinstance(hold(account, key_id, "1"), balances.HeldCredit)
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
    assert isinstance(hold(account, key_id, "0.01"), balances.BudgetShortfall)
    # Nothing is asked at the end: the next window starts with the next request.
    later = first + timedelta(hours=7, minutes=3)
    clock.now = later
    spend(account, key_id, "1", "g-later")
    assert counters(key_id) == (Decimal("1"), 0, unix_micros(later))
    clock.now = later + timedelta(hours=4, minutes=59)
    assert isinstance(hold(account, key_id, "0.01"), balances.BudgetShortfall)
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
    settlement.settle_hold(crossing, cost=Decimal("0.4"), generation_id=crossing.id)
    # The new day counts only its own request; the crossing one was the old day's.
    assert counters(key_id)[:2] == (Decimal("0.3"), 0)
    assert isinstance(hold(account, key_id, "0.7"), balances.HeldCredit)
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
    assert refused == balances.BudgetShortfall(
        requested=Decimal("0.5"),
        available=Decimal("0.4"),
        budget=Decimal("1"),
        window="week",
        holder=balances.MEMBER_BUDGET,
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
    charged = settlement.settle_hold(held, cost=Decimal("3"), generation_id=held.id)
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


class RowWrites:
    """Which of a key's and its member's rows were written, and which only locked.

    On PostgreSQL by the rows' versions (``xmin``) and lockers (``xmax``), whatever
    statement did it; on SQLite, whose hold runs step by step, by the UPDATEs the
    ledger ran of either table (SQLite locks no row).
    """

    TABLES = ("api_keys", "memberships")

    def __init__(self, monkeypatch, key_id: int) -> None:
        self.ids = {"api_keys": key_id, "memberships": member_of(key_id)}
        self.postgresql = db.engine.dialect.name == "postgresql"
        self.updated: set[str] = set()
        self.locked: set[str] = set()
        if not self.postgresql:
            for module, name in (
                (holds, "execute_on_driver"),
                (holds, "fetch_on_driver"),
                (settlement, "execute_on_driver"),
            ):
                monkeypatch.setattr(module, name, self._noting(getattr(module, name)))
        self.versions = self._versions()

    def _noting(self, run):
        def noted(connection, statement, parameters):
            if statement.is_dml and getattr(statement, "table", None) is not None:
                if statement.is_update and statement.table.name in self.TABLES:
                    self.updated.add(statement.table.name)
            return run(connection, statement, parameters)

        return noted

    def _versions(self) -> dict[str, tuple]:
        if not self.postgresql:
            return {}
        versions = {
            table: tuple(
                db.session.execute(
                    text(f"SELECT xmin::text, xmax::text FROM {table} WHERE id = :id"),
                    {"id": row_id},
                ).one()
            )
            for table, row_id in self.ids.items()
        }
        db.session.commit()
        return versions

    def since_last(self) -> set[str]:
        """Return the tables whose row was written since the last call (or the start).

        The tables whose row was only locked meanwhile are left in ``locked``.
        """
        versions = self._versions()
        changed = {t for t in self.TABLES if versions.get(t) != self.versions.get(t)}
        written = {t for t in changed if versions[t][0] != self.versions[t][0]} | self.updated
        self.locked = changed - written
        self.versions, self.updated = versions, set()
        return written


def member_of(key_id: int) -> int:
    return db.session.scalar(select(ApiKey.member_id).where(ApiKey.id == key_id))


def member_counters(member_id: int) -> tuple[Decimal, Decimal]:
    db.session.expire_all()
    member = db.session.get(Membership, member_id)
    return member.window_spent, member.window_reserved


def reservations(hold_id: str) -> tuple[bool, bool]:
    noted = db.session.execute(
        select(Hold.reserved_on_key, Hold.reserved_on_member).where(Hold.id == hold_id)
    ).one()
    db.session.commit()
    return tuple(noted)


def test_a_hold_neither_writes_nor_locks_a_key_and_member_without_budgets(
    app_context, clock, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="unbudgeted").id
    writes = RowWrites(monkeypatch, key_id)

    held = hold(account, key_id, "0.5", hold_id=unique("g-unwritten"))

    assert isinstance(held, balances.HeldCredit)
    assert writes.since_last() == set()
    assert writes.locked == set()
    assert reservations(held.id) == (False, False)
    assert counters(key_id)[:2] == (0, 0)
    settlement.settle_hold(held, cost=Decimal("0.2"), generation_id=held.id)
    # The settlement writes each row once: the charge counted in its window, the key's use.
    assert writes.since_last() == {"api_keys", "memberships"}
    assert counters(key_id) == (Decimal("0.2"), 0, unix_micros(datetime(2026, 3, 1, tzinfo=UTC)))
    assert member_counters(member_of(key_id)) == (Decimal("0.2"), 0)
    assert db.session.get(ApiKey, key_id).last_used_at is not None
    assert_audit_clean(account.id)


def test_a_hold_reserves_on_the_budgeted_row_alone(app_context, clock, monkeypatch):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="budgeted").id
    set_key_budget(key_id, amount=Decimal("1"), window="day")
    writes = RowWrites(monkeypatch, key_id)

    held = hold(account, key_id, "0.5", hold_id=unique("g-on-key"))

    assert writes.since_last() == {"api_keys"}
    # PostgreSQL's hold locks the member's row with the key's (a read of it apart cost
    # more than the lock, hold_sql.hold_in_one_statement), and writes it not.
    assert writes.locked == ({"memberships"} if writes.postgresql else set())
    assert reservations(held.id) == (True, False)
    assert counters(key_id)[1] == Decimal("0.5")
    assert member_counters(member_of(key_id)) == (0, 0)
    settlement.settle_hold(held, cost=Decimal("0.3"), generation_id=held.id)
    assert counters(key_id)[:2] == (Decimal("0.3"), 0)
    assert member_counters(member_of(key_id)) == (Decimal("0.3"), 0)
    assert_audit_clean(account.id)


@pytest.mark.parametrize("on", ["key", "member"])
def test_a_budget_set_takes_over_the_holds_already_running(app_context, clock, on):
    account = AccountFactory.create(credits=Decimal("10"))
    member_id = add_member(account.id, f"running-{secrets.token_hex(4)}@example.com")
    key_id = create_key(account_id=account.id, name="running", member_id=member_id).id
    first = hold(account, key_id, "0.4", hold_id=unique("g-running-1"))
    second = hold(account, key_id, "0.3", hold_id=unique("g-running-2"))
    assert reservations(first.id) == (False, False)

    if on == "key":
        set_key_budget(key_id, amount=Decimal("1"), window="month")
    else:
        set_member_budget(member_id, amount=Decimal("1"), window="month")

    taken_over = (True, False) if on == "key" else (False, True)
    assert reservations(first.id) == reservations(second.id) == taken_over
    reserved = counters(key_id)[1] if on == "key" else member_counters(member_id)[1]
    assert reserved == Decimal("0.7")
    # New requests leave room for the running ones: 0.3 is left, not 1.
    refused = hold(account, key_id, "0.4")
    assert isinstance(refused, balances.BudgetShortfall) and refused.available == Decimal("0.3")
    settlement.settle_hold(first, cost=Decimal("0.1"), generation_id=first.id)
    settlement.settle_hold(second, cost=Decimal("0.2"), generation_id=second.id)
    assert counters(key_id)[:2] == (Decimal("0.3"), 0)
    assert member_counters(member_id) == (Decimal("0.3"), 0)
    assert_audit_clean(account.id)


def test_a_budget_removed_leaves_its_holds_to_release_what_they_reserved(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    member_id = add_member(account.id, f"removed-{secrets.token_hex(4)}@example.com")
    key_id = create_key(account_id=account.id, name="lifted", member_id=member_id).id
    set_key_budget(key_id, amount=Decimal("1"), window="week")
    set_member_budget(member_id, amount=Decimal("2"), window="week")
    settled = hold(account, key_id, "0.4", hold_id=unique("g-reserved-settled"))
    expiring = holds.place_hold(
        account_id=account.id, amount=Decimal("0.2"), ttl_seconds=1, key_id=key_id
    )

    set_key_budget(key_id, amount=None, window="week")
    set_member_budget(member_id, amount=None, window="week")
    unreserved = hold(account, key_id, "0.5", hold_id=unique("g-after-removal"))

    assert reservations(settled.id) == reservations(expiring.id) == (True, True)
    assert reservations(unreserved.id) == (False, False)
    assert counters(key_id)[1] == member_counters(member_id)[1] == Decimal("0.6")
    settlement.settle_hold(settled, cost=Decimal("0.4"), generation_id=settled.id)
    settlement.settle_hold(unreserved, cost=Decimal("0.1"), generation_id=unreserved.id)
    clock.now += timedelta(seconds=2)
    assert expiry.release_expired_holds(account_id=account.id) == 1
    assert counters(key_id)[:2] == (Decimal("0.5"), 0)
    assert member_counters(member_id) == (Decimal("0.5"), 0)
    assert_audit_clean(account.id)


def test_an_expired_hold_releases_nothing_from_rows_it_did_not_reserve_on(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="expiring").id
    set_key_budget(key_id, amount=Decimal("5"), window="day")
    on_key = holds.place_hold(
        account_id=account.id, amount=Decimal("0.2"), ttl_seconds=1, key_id=key_id
    )
    # Reserved on the key alone: the member's row would go below zero if it released it.
    assert reservations(on_key.id) == (True, False)
    clock.now += timedelta(seconds=2)

    assert expiry.release_expired_holds(account_id=account.id) == 1

    assert counters(key_id)[:2] == (0, 0)
    assert member_counters(member_of(key_id)) == (0, 0)
    assert_audit_clean(account.id)


def test_a_row_without_budget_counts_the_window_its_charges_were_held_in(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="months").id
    clock.now = datetime(2026, 3, 31, 23, 0, tzinfo=UTC)
    spend(account, key_id, "0.6", "g-march")
    crossing = hold(account, key_id, "0.2", hold_id=unique("g-crossing-month"))
    clock.now = datetime(2026, 4, 2, tzinfo=UTC)
    settlement.settle_hold(crossing, cost=Decimal("0.2"), generation_id=crossing.id)
    # April began: its spend starts at zero, and March's hold counts no more.
    assert counters(key_id) == (0, 0, unix_micros(datetime(2026, 4, 1, tzinfo=UTC)))
    spend(account, key_id, "0.1", "g-april")
    set_key_budget(key_id, amount=Decimal("0.5"), window="month")
    assert counters(key_id)[0] == Decimal("0.1")
    refused = hold(account, key_id, "0.41")
    assert isinstance(refused, balances.BudgetShortfall) and refused.available == Decimal("0.4")
    assert_audit_clean(account.id)


def test_the_audit_finds_a_reservation_its_hold_did_not_make(app_context, clock):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="miscounted").id
    held = hold(account, key_id, "0.25", hold_id=unique("g-miscounted"))
    db.session.execute(update(Hold).where(Hold.id == held.id).values(reserved_on_key=True))
    db.session.commit()
    problems = [str(m) for m in audit_ledger([account.id], full=True).mismatches]
    assert problems == [f"key {key_id}: reserved $0 but its open holds sum to $0.25"]
    db.session.execute(update(Hold).where(Hold.id == held.id).values(reserved_on_key=False))
    db.session.commit()
    settlement.settle_hold(held, cost=Decimal("0"), generation_id=held.id)
    assert_audit_clean(account.id)


def test_a_hold_reserves_nothing_in_the_statement_that_cannot(app_context, clock, monkeypatch):
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="shapes").id
    # PostgreSQL's hold is one statement, SQLite's steps end with the hold's INSERT.
    without = (
        hold_sql.hold_without_reservations(guards.ACCOUNT_COVERS),
        hold_sql.INSERT_HOLD_RESERVING_NOTHING,
    )
    reserving = (hold_sql.INSERT_HOLD,)
    sent = []

    def noting(run, sent_alone: bool):
        def run_noted(*arguments, **options):
            statement = arguments[0] if sent_alone else arguments[1]
            if statement in without:
                sent.append("without")
            elif sent_alone or statement in reserving:
                sent.append("reserving")
            return run(*arguments, **options)

        return run_noted

    monkeypatch.setattr(holds, "execute_alone", noting(holds.execute_alone, True))
    monkeypatch.setattr(holds, "execute_on_driver", noting(holds.execute_on_driver, False))

    def shapes_of_a_hold() -> list[str]:
        sent.clear()
        spend(account, key_id, "0.01", "g-shape")
        return list(sent)

    assert shapes_of_a_hold() == ["without"]
    set_key_budget(key_id, amount=Decimal("1"), window="day")
    # Its budget found, the key's holds go straight to the statement that reserves.
    assert shapes_of_a_hold() == ["without", "reserving"]
    assert shapes_of_a_hold() == ["reserving"]
    set_key_budget(key_id, amount=None, window="day")
    assert shapes_of_a_hold() == ["reserving"]
    assert shapes_of_a_hold() == ["without"]
    assert counters(key_id)[1] == 0
    assert_audit_clean(account.id)


def waiting_on_a_lock(statement_start: str, timeout: float = 20) -> None:
    """Return once a connection's statement starting with ``statement_start`` waits on a lock."""
    deadline = time.monotonic() + timeout
    with db.engine.connect() as watcher:
        while time.monotonic() < deadline:
            waiting = watcher.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE wait_event_type = 'Lock' AND query LIKE :start"
                ),
                {"start": statement_start + "%"},
            ).scalar()
            watcher.rollback()
            if waiting:
                return
            time.sleep(0.02)
    raise AssertionError(f"no statement {statement_start!r} waited on a lock")


def test_a_budgets_change_ended_to_break_a_deadlock_runs_again(app_context, database_url):
    """A settlement takes its hold's row, then its key's; a budget's new window the reverse.

    PostgreSQL ends the budget's change (it waited first): it runs again once the
    settlement has its rows, where it used to fail its caller (a 500 on the dashboard).
    """
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite runs one write transaction at a time: no two wait on each other")
    account = AccountFactory.create(credits=Decimal("10"))
    key_id = create_key(account_id=account.id, name="deadlocked").id
    set_key_budget(key_id, amount=Decimal("5"), window="month")
    held = hold(account, key_id, "0.01", hold_id=unique("deadlocked"))
    outcome: dict[str, object] = {}

    def change_the_window() -> None:
        with app_context.app_context():
            try:
                set_key_budget(key_id, amount=None, window="week")
                outcome["changed"] = True
            except Exception as error:  # noqa: BLE001 - the test reports it
                outcome["error"] = error

    with db.engine.connect() as settlement:
        settlement.execute(text("UPDATE holds SET status = status WHERE id = :id"), {"id": held.id})
        changing = threading.Thread(target=change_the_window)
        changing.start()
        waiting_on_a_lock("UPDATE holds")
        settlement.execute(
            text("UPDATE api_keys SET last_used_at = now() WHERE id = :id"), {"id": key_id}
        )
        settlement.commit()
    changing.join(timeout=60)

    assert outcome == {"changed": True}
    db.session.expire_all()
    key = db.session.get(ApiKey, key_id)
    assert key.budget is None and key.budget_window == "week"
