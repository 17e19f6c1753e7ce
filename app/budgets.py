"""Budgets: an amount in USD that a key or a member may spend in a window of time.

A window is ``day``, ``week`` (Monday to Sunday) or ``month``, calendar windows in UTC,
or ``5h``: five hours from the first request after the previous such window ended, as
subscription plans count usage. The row that has a budget (a key, a membership) keeps
the start of its current window beside its counters (``BudgetCounters``); the hold that
finds the stored start older than the window its own time falls in starts the counters
of the new window at zero, in the same statement, so that windows roll over without a
sweep and exactly at their boundary. Window starts are kept as Unix microseconds (UTC),
the resolution of the holds' times, so that both databases compare and add them as
integers and a rolling window starts after every hold of the one before.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import BigInteger, String
from sqlalchemy.orm import Mapped, mapped_column

from app.database import Money

DAY, WEEK, MONTH, FIVE_HOURS = "day", "week", "month", "5h"
WINDOWS = (DAY, WEEK, MONTH, FIVE_HOURS)
MICROS = 1_000_000
DAY_SECONDS = 86_400
DAY_MICROS = DAY_SECONDS * MICROS
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A rolling window's length, in microseconds.
ROLLING_MICROS = {FIVE_HOURS: 5 * 3600 * MICROS}


class BudgetCounters:
    """The columns of a row that may have a budget, and counts its spend in windows.

    ``budget`` is the amount in USD (None: no budget; the spend is counted all the
    same, in ``budget_window``); ``window_spent`` is what was charged in the window that
    started at ``window_start`` (Unix microseconds, UTC) and ``window_reserved`` what the
    open holds that reserved on the row set aside, whichever window they were placed in
    (a hold reserves on a row with a budget, or a rolling window, only).
    """

    budget = mapped_column(Money, nullable=True)
    budget_window: Mapped[str] = mapped_column(
        String(8), nullable=False, default=MONTH, server_default=MONTH
    )
    window_start: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    window_spent = mapped_column(Money, nullable=False, default=0, server_default="0")
    window_reserved = mapped_column(Money, nullable=False, default=0, server_default="0")


def unix_micros(moment: datetime) -> int:
    """Return ``moment`` (UTC) as whole Unix microseconds."""
    return (moment.replace(tzinfo=moment.tzinfo or UTC) - EPOCH) // timedelta(microseconds=1)


def from_unix_micros(micros: int) -> datetime:
    """Return the UTC instant ``micros`` microseconds after the epoch."""
    return EPOCH + timedelta(microseconds=micros)


def calendar_start(window: str, moment: datetime) -> datetime:
    """Return the first instant of the calendar ``window`` (UTC) that ``moment`` falls in."""
    day = moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if window == DAY:
        return day
    if window == WEEK:
        return day - timedelta(days=day.weekday())
    return day.replace(day=1)


def calendar_end(window: str, start: datetime) -> datetime:
    """Return the first instant after the calendar ``window`` that starts at ``start``."""
    if window == DAY:
        return start + timedelta(days=1)
    if window == WEEK:
        return start + timedelta(days=7)
    return (start + timedelta(days=32)).replace(day=1)


def window_parameters(moment: datetime) -> dict[str, int]:
    """Return what a hold's statement needs to know the window ``moment`` falls in.

    The calendar windows' starts, and the moment itself, from which a rolling window
    that has ended starts again (every row picks its own by its ``budget_window``).
    Worked out in integers: every request's hold asks.
    """
    since_epoch = moment.astimezone(UTC) - EPOCH
    days = since_epoch.days
    now = (days * DAY_SECONDS + since_epoch.seconds) * MICROS + since_epoch.microseconds
    # 1970-01-01 was a Thursday: a week starts (days + 3) % 7 days before.
    return {
        "day_start": days * DAY_MICROS,
        "week_start": (days - (days + 3) % 7) * DAY_MICROS,
        "month_start": _month_start_micros(moment.year, moment.month),
        "now_micros": now,
    }


@functools.lru_cache(maxsize=16)
def _month_start_micros(year: int, month: int) -> int:
    return unix_micros(datetime(year, month, 1, tzinfo=UTC))


def current_window_start(window: str, stored_start: int | None, moment: datetime) -> int:
    """Return the start of ``window``'s window at ``moment``, as the hold's statement does."""
    now = unix_micros(moment)
    if window in ROLLING_MICROS:
        if stored_start is not None and stored_start > now - ROLLING_MICROS[window]:
            return stored_start
        return now
    return unix_micros(calendar_start(window, moment))


def window_end(window: str, start: int) -> datetime:
    """Return when the window of ``window`` that started at ``start`` ends (resets)."""
    if window in ROLLING_MICROS:
        return from_unix_micros(start + ROLLING_MICROS[window])
    return calendar_end(window, from_unix_micros(start))


@dataclass(frozen=True)
class BudgetState:
    """A budget as it stands at a moment: its window, what was spent in it, what is left."""

    amount: Decimal | None
    window: str
    window_start: datetime
    resets_at: datetime
    spent: Decimal
    reserved: Decimal

    @property
    def remaining(self) -> Decimal | None:
        """What may still be held or charged in this window; None: no budget."""
        if self.amount is None:
            return None
        return max(self.amount - self.spent - self.reserved, Decimal(0))


def budget_state(row: BudgetCounters, moment: datetime) -> BudgetState:
    """Return ``row``'s budget as it stands at ``moment``: a window that ended counts zero."""
    start = current_window_start(row.budget_window, row.window_start, moment)
    spent = row.window_spent if start == row.window_start else Decimal(0)
    return BudgetState(
        amount=row.budget,
        window=row.budget_window,
        window_start=from_unix_micros(start),
        resets_at=window_end(row.budget_window, start),
        spent=Decimal(spent),
        reserved=Decimal(row.window_reserved),
    )
