"""A statement's period: a month or whole days, anything else refused with a clear message."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.ledger_statements.errors import InvalidPeriod
from app.ledger_statements.periods import months_between, parse_period

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def test_a_month_runs_from_its_first_day_to_the_next_month_s():
    period = parse_period("2025-12", now=NOW)
    assert (period.start, period.end) == (
        datetime(2025, 12, 1, tzinfo=UTC),
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert period.complete(NOW) and not parse_period("2026-11", now=NOW).complete(NOW)


def test_a_range_of_days_includes_its_last_day():
    days = parse_period("2026-11-01..2026-11-30", now=NOW)
    month = parse_period("2026-11", now=NOW)
    assert (days.start, days.end) == (month.start, month.end)
    assert days.label == "2026-11-01..2026-11-30"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2026-13", "is not a period"),
        ("2026-00", "is not a period"),
        ("26-11", "is not a period"),
        ("2026-11-31..2026-12-01", "is not a period"),
        ("", "is not a period"),
        ("2026-11-05..2026-11-04", "ends before it starts"),
        ("2026-12", "has not begun"),
        ("2026-11-30..2027-01-01", "has not begun"),
        ("2999-12", "has not begun"),
    ],
)
def test_what_is_no_period_is_refused_naming_why(text, message):
    with pytest.raises(InvalidPeriod, match=message) as refused:
        parse_period(text, now=NOW)
    assert refused.value.status == 400 and refused.value.param == "period"


def test_the_months_listed_run_from_the_account_s_first_to_now_newest_first():
    months = months_between(datetime(2025, 11, 15, tzinfo=UTC), NOW)
    assert [month.label for month in months][:2] == ["2026-11", "2026-10"]
    assert months[-1].label == "2025-11" and len(months) == 13
