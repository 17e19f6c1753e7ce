"""The periods a statement covers: a calendar month (UTC), or a range of whole days.

A period is written ``YYYY-MM`` (a month) or ``YYYY-MM-DD..YYYY-MM-DD`` (from the first
day's start to the last day's end, both included), and covers the times from its start
up to, not including, its end. One that has not begun yet is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from app.ledger_statements.errors import InvalidPeriod

_MONTH = re.compile(r"(\d{4})-(\d{2})")
_RANGE = re.compile(r"(\d{4}-\d{2}-\d{2})\.\.(\d{4}-\d{2}-\d{2})")
FORMATS = "YYYY-MM (a month) or YYYY-MM-DD..YYYY-MM-DD (whole days, both included)"


@dataclass(frozen=True)
class Period:
    """The times ``start`` (included) to ``end`` (excluded), UTC, and how they are written."""

    label: str
    start: datetime
    end: datetime

    def complete(self, now: datetime) -> bool:
        """Tell whether the period is over at ``now``: its statement will not grow."""
        return self.end <= now


def month_period(year: int, month: int) -> Period:
    """Return the calendar month ``year``-``month`` (UTC)."""
    start = datetime(year, month, 1, tzinfo=UTC)
    following = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return Period(f"{year:04d}-{month:02d}", start, following)


def parse_period(text: str, *, now: datetime) -> Period:
    """Return the period ``text`` writes.

    :raise InvalidPeriod: it is written otherwise, names no real day or month, ends
        before it starts, or starts after ``now``.
    """
    try:
        period = _parsed(text.strip())
    except (ValueError, OverflowError):
        period = None
    if period is None:
        raise InvalidPeriod(f"{text[:40]!r} is not a period: write {FORMATS}.")
    if period.start > now:
        raise InvalidPeriod(f"The period {period.label} has not begun yet.")
    return period


def _parsed(text: str) -> Period | None:
    if month := _MONTH.fullmatch(text):
        year, number = int(month[1]), int(month[2])
        return month_period(year, number) if 1 <= number <= 12 else None
    if days := _RANGE.fullmatch(text):
        first, last = date.fromisoformat(days[1]), date.fromisoformat(days[2])
        if last < first:
            raise InvalidPeriod(f"The period {text} ends before it starts.")
        start = datetime.combine(first, time(), UTC)
        return Period(text, start, datetime.combine(last + timedelta(days=1), time(), UTC))
    return None


def months_between(since: datetime, now: datetime) -> list[Period]:
    """Return the months from the one ``since`` falls in to ``now``'s, newest first."""
    year, month = since.astimezone(UTC).year, since.astimezone(UTC).month
    months = []
    while (year, month) <= (now.year, now.month):
        months.append(month_period(year, month))
        year, month = year + month // 12, month % 12 + 1
    return months[::-1]
