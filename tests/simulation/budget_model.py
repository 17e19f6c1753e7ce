"""The simulator's own account of budgets: each key's and member's window and counters.

It follows every hold, charge, release and budget change of a run by the rules the
ledger documents (app.budgets, app.credits.holds, app.accounts.budgets), worked out
here apart from their code: which window a moment falls in (a calendar day, week or
month in UTC, or five hours from the first request after the last such window ended),
what a hold reserves and notes, in which window a charge counts, and what a window that
a budget change starts has counted so far. From it the simulator foretells which limit
refuses a hold (the balance's, the key's budget or the member's, checked in that order)
and what a settlement may charge beyond its hold, and checks every row's counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

DAY, WEEK, MONTH, FIVE_HOURS = "day", "week", "month", "5h"
ROLLING = {FIVE_HOURS: timedelta(hours=5)}
# Whose limit refuses a hold, in the order the hold's statement asks them.
BALANCE, KEY, MEMBER = "balance", "key", "member"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ZERO = Decimal(0)


def micros(moment: datetime) -> int:
    """``moment`` as whole microseconds since the Unix epoch, as window starts are kept."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def moment(micros_since_epoch: int) -> datetime:
    """The instant a window start (microseconds since the Unix epoch) names."""
    return EPOCH + timedelta(microseconds=micros_since_epoch)


def window_start(window: str, stored: int | None, now: datetime) -> int:
    """The start of the window ``now`` falls in, for a row whose window began at ``stored``.

    A rolling window goes on for its length from its start, and the first hold after it
    starts the next one.
    """
    if window in ROLLING:
        if stored is not None and now - moment(stored) < ROLLING[window]:
            return stored
        return micros(now)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == DAY:
        return micros(midnight)
    if window == WEEK:
        return micros(midnight - timedelta(days=midnight.weekday()))
    return micros(midnight.replace(day=1))


def calendar_ends(now: datetime) -> Iterator[tuple[str, datetime]]:
    """The ends of the day, the week (Monday) and the month that ``now`` falls in."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    yield DAY, midnight + timedelta(days=1)
    yield WEEK, midnight + timedelta(days=7 - midnight.weekday())
    yield MONTH, (midnight.replace(day=1) + timedelta(days=32)).replace(day=1)


@dataclass
class Counters:
    """One key's or member's budget and counters, as its row must hold them."""

    name: str
    budget: Decimal | None = None
    window: str = MONTH
    start: int | None = None
    spent: Decimal = ZERO
    reserved: Decimal = ZERO

    def spent_now(self, now: datetime) -> Decimal:
        """What was spent in the window ``now`` falls in: a window that ended counts nothing."""
        current = window_start(self.window, self.start, now)
        return self.spent if self.start == current else ZERO

    def room(self, now: datetime) -> Decimal | None:
        """What may still be held or charged in the window (None: no budget)."""
        if self.budget is None:
            return None
        return max(self.budget - self.spent_now(now) - self.reserved, ZERO)

    def admits(self, amount: Decimal, now: datetime) -> bool:
        """Whether a hold of ``amount`` fits the budget now."""
        return self.budget is None or self.spent_now(now) + self.reserved + amount <= self.budget

    def reserves(self) -> bool:
        """Whether a hold reserves on the row: it has a budget, or a rolling window.

        A reservation on a row without a budget would protect nothing; a rolling
        window's row is written by every hold, which starts its window.
        """
        return self.budget is not None or self.window in ROLLING

    def reserve(self, amount: Decimal, now: datetime) -> tuple[int, bool]:
        """Hold on the row: the window the hold is noted in, and whether it reserved here.

        A row it reserves on rolls its window over first; any other is left as it is,
        the hold noted in the calendar window of its time.
        """
        if not self.reserves():
            return self.calendar_start(now), False
        self.spent, self.start = self.spent_now(now), window_start(self.window, self.start, now)
        self.reserved += amount
        return self.start, True

    def calendar_start(self, now: datetime) -> int:
        """The calendar window's start at ``now``; a window never goes back."""
        return max(window_start(self.window, None, now), self.start or 0)

    def window_end(self, now: datetime) -> datetime | None:
        """When the window ``now`` falls in ends (None: a rolling one not begun yet)."""
        if self.window not in ROLLING:
            return dict(calendar_ends(now))[self.window]
        if self.start is None or now - moment(self.start) >= ROLLING[self.window]:
            return None
        return moment(self.start) + ROLLING[self.window]

    def spend(self, noted: int | None, charge: Decimal, released: Decimal, now: datetime) -> None:
        """Settle a hold noted in window ``noted``: its charge counts only if that is this one.

        A calendar window rolls over first, so that a row no hold writes counts its
        window's spend too; a rolling one is moved on by holds alone. ``released`` is
        what the hold reserved here.
        """
        if self.window not in ROLLING and self.start != (start := self.calendar_start(now)):
            self.start, self.spent = start, ZERO
        if noted is not None and noted == self.start:
            self.spent += charge
        self.reserved -= released

    def as_of(self, now: datetime) -> tuple[int | None, Decimal]:
        """Return the window start and spend the row counts at ``now``.

        An ended calendar window's spend counts nothing, whether a settlement or a hold
        has rolled the row over yet.
        """
        if self.window in ROLLING or self.start is None:
            return self.start, self.spent
        start = self.calendar_start(now)
        return start, self.spent if self.start == start else ZERO


@dataclass
class Held:
    """A hold as the model follows it: whose it is, when it was placed, where it counts."""

    key: Counters
    member: Counters
    amount: Decimal
    placed_at: datetime
    key_noted: int
    member_noted: int
    # Whether it reserved on the key's row, and on the member's.
    on_key: bool = True
    on_member: bool = True
    open: bool = True
    charge: Decimal = ZERO


@dataclass(frozen=True)
class Forecast:
    """What a request's hold comes to: held at ``amount``, or refused by ``refused_by``.

    A refusal tells what was asked and what the refusing limit leaves; a budget's also
    its amount and window. ``resized_by`` is the limit that a hold sized by the prompt's
    bound did not fit (None: it was held so).
    """

    amount: Decimal
    refused_by: str | None = None
    left: Decimal = ZERO
    budget: Decimal | None = None
    window: str | None = None
    resized_by: str | None = None


@dataclass
class BudgetModel:
    """Every key's and member's counters, and every hold placed on them."""

    keys: dict[int, Counters] = field(default_factory=dict)
    members: dict[int, Counters] = field(default_factory=dict)
    member_of: dict[int, int] = field(default_factory=dict)
    holds: dict[str, Held] = field(default_factory=dict)

    def add_member(self, member_id: int, name: str) -> None:
        """A member joined: no budget, a month's window not yet started."""
        self.members[member_id] = Counters(name)

    def add_key(self, key_id: int, member_id: int, name: str) -> None:
        """A key was issued to ``member_id``."""
        self.keys[key_id] = Counters(name)
        self.member_of[key_id] = member_id

    def limits(self, key_id: int) -> tuple[Counters, Counters]:
        """The key's counters and its member's."""
        return self.keys[key_id], self.members[self.member_of[key_id]]

    def refusal(
        self, key_id: int, amount: Decimal, available: Decimal, now: datetime
    ) -> str | None:
        """Which limit refuses a hold of ``amount`` now, the first asked (None: it is held)."""
        key, member = self.limits(key_id)
        if available < amount:
            return BALANCE
        if not key.admits(amount, now):
            return KEY
        if not member.admits(amount, now):
            return MEMBER
        return None

    def expect_hold(
        self,
        key_id: int,
        amounts: tuple[Decimal, Decimal],
        available: Decimal,
        expired: list[str],
        now: datetime,
    ) -> Forecast:
        """Foretell a request's hold, sized first by its prompt's bound, then by its count.

        A hold that does not fit first releases the account's ``expired`` holds (their
        workers died before any progress was recorded): the model releases them too.
        The refusal is the count's, by the first limit it does not fit.
        """
        bound, counted = amounts
        if self.refusal(key_id, bound, available, now) is None:
            return Forecast(bound)
        for hold_id in expired:
            available += self.holds[hold_id].amount
            self.release(hold_id)
        if (resized_by := self.refusal(key_id, bound, available, now)) is None:
            return Forecast(bound)
        if (refused_by := self.refusal(key_id, counted, available, now)) is None:
            return Forecast(counted, resized_by=resized_by)
        if refused_by == BALANCE:
            return Forecast(counted, BALANCE, max(available, ZERO))
        key, member = self.limits(key_id)
        limit = member if refused_by == MEMBER else key
        return Forecast(counted, refused_by, limit.room(now), limit.budget, limit.window)

    def hold(self, hold_id: str, key_id: int, amount: Decimal, now: datetime) -> None:
        """A hold of ``amount`` was placed on the key and its member."""
        key, member = self.limits(key_id)
        (key_noted, on_key), (member_noted, on_member) = (
            key.reserve(amount, now),
            member.reserve(amount, now),
        )
        self.holds[hold_id] = Held(
            key, member, amount, now, key_noted, member_noted, on_key, on_member
        )

    def settle(self, hold_id: str, charge: Decimal, now: datetime) -> None:
        """The hold's request was charged ``charge``; an open hold's reservation ends with it."""
        held = self.holds[hold_id]
        was_open = held.open
        held.open, held.charge = False, charge
        held.key.spend(held.key_noted, charge, held.amount * (was_open and held.on_key), now)
        held.member.spend(
            held.member_noted, charge, held.amount * (was_open and held.on_member), now
        )

    def release(self, hold_id: str) -> None:
        """The hold expired with nothing charged: the reservations it made end."""
        held = self.holds[hold_id]
        if held.open:
            held.open = False
            held.key.reserved -= held.amount * held.on_key
            held.member.reserved -= held.amount * held.on_member

    def reserved_by(self, hold_id: str) -> tuple[Counters, ...]:
        """The rows an open hold reserved on: its key's, its member's, both or neither."""
        held = self.holds[hold_id]
        return tuple(c for c, on in ((held.key, held.on_key), (held.member, held.on_member)) if on)

    def room(self, key_id: int, now: datetime) -> Decimal | None:
        """The least that the key's and its member's budgets leave (None: neither has one)."""
        rooms = [c.room(now) for c in self.limits(key_id)]
        return min((r for r in rooms if r is not None), default=None)

    def set_key_budget(
        self, key_id: int, amount: Decimal | None, window: str, now: datetime
    ) -> None:
        """The key's budget became ``amount`` a ``window``."""
        key = self.keys[key_id]
        holds = [h for h in self.holds.values() if h.key is key]
        self._take_over(key, amount, holds, "on_key")
        self._set_budget(key, amount, window, now, holds, "key_noted")

    def set_member_budget(
        self, member_id: int, amount: Decimal | None, window: str, now: datetime
    ) -> None:
        """The member's budget became ``amount`` a ``window``: all their keys count in it."""
        member = self.members[member_id]
        holds = [h for h in self.holds.values() if h.member is member]
        self._take_over(member, amount, holds, "on_member")
        self._set_budget(member, amount, window, now, holds, "member_noted")

    @staticmethod
    def _take_over(counters: Counters, amount: Decimal | None, holds: list[Held], on: str) -> None:
        """A budget set takes over the open holds that did not reserve on the row.

        They join its reservation, so that new holds leave room for them; a budget
        removed leaves each reservation to end with its hold.
        """
        if amount is None:
            return
        for held in holds:
            if held.open and not getattr(held, on):
                setattr(held, on, True)
                counters.reserved += held.amount

    @staticmethod
    def _set_budget(
        counters: Counters,
        amount: Decimal | None,
        window: str,
        now: datetime,
        holds: list[Held],
        noted: str,
    ) -> None:
        """Set a budget; a new calendar window counts the charges of the holds placed in it.

        Those holds are noted as counted in it, so that the open ones' charges will count
        when they settle. A new rolling window starts with the next hold.
        """
        counters.budget = amount
        if window == counters.window:
            return
        counters.window = window
        if window in ROLLING:
            counters.start, counters.spent = None, ZERO
            return
        counters.start = window_start(window, None, now)
        in_window = [h for h in holds if h.placed_at >= moment(counters.start)]
        for held in in_window:
            setattr(held, noted, counters.start)
        counters.spent = sum((h.charge for h in in_window if not h.open), ZERO)

    def window_ends(self, now: datetime) -> list[tuple[Counters | None, datetime]]:
        """The coming ends of windows: the day's (None), and every budget's current one."""
        ends: list[tuple[Counters | None, datetime]] = [(None, next(calendar_ends(now))[1])]
        for counters in self.budgeted():
            if (end := counters.window_end(now)) is not None:
                ends.append((counters, end))
        return ends

    def spent_ends(self, now: datetime, little: Decimal) -> list[tuple[Counters, datetime]]:
        """The coming ends of the windows of budgets that leave less than ``little``."""
        return [
            (counters, end)
            for counters in self.budgeted()
            if (end := counters.window_end(now)) is not None and counters.room(now) < little
        ]

    def budgeted(self) -> list[Counters]:
        """The members and keys that have a budget."""
        return [c for c in [*self.members.values(), *self.keys.values()] if c.budget is not None]
