"""The usage chart's layout and how amounts are written."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from wtforms.validators import ValidationError

from app.accounts.organisations import organisation_label
from app.dashboard.charts import HEIGHT, spend_chart
from app.dashboard.formatting import format_usd, usd_places
from app.dashboard.forms import parse_usd

TODAY = date(2026, 11, 22)


def test_bars_stack_per_day_and_scale_to_the_busiest_day():
    spend = {
        (TODAY, "a"): Decimal("0.3"),
        (TODAY, "b"): Decimal("0.1"),
        (date(2026, 11, 20), "a"): Decimal("0.2"),
    }
    chart = spend_chart(spend, days=30, today=TODAY)
    assert [label for label, _ in chart.legend] == ["a", "b"]
    assert chart.total == Decimal("0.6")
    assert [t.text for t in chart.y_ticks] == ["$0.00", "$0.20", "$0.40"]
    today_bars = [bar for bar in chart.bars if bar.title.startswith("2026-11-22")]
    assert len(today_bars) == 2 and len(chart.bars) == 3
    a, b = today_bars
    assert a.y + a.height == pytest.approx(HEIGHT - 24) and b.y + b.height == pytest.approx(a.y)
    assert a.height == pytest.approx(3 * b.height)
    assert chart.x_ticks[-1].text == "Nov 22"


def test_an_empty_month_draws_no_bars_but_an_axis():
    chart = spend_chart({}, days=30, today=TODAY)
    assert (
        chart.bars == []
        and chart.total == 0
        and [t.text for t in chart.y_ticks]
        == [
            "$0.00",
            "$0.01",
            "$0.02",
        ]
    )


def test_the_axis_of_a_day_under_a_cent_writes_its_ticks_with_even_decimals():
    chart = spend_chart({(TODAY, "a"): Decimal("0.000669")}, days=30, today=TODAY)
    assert [t.text for t in chart.y_ticks] == ["$0.0000", "$0.0004", "$0.0008"]
    (bar,) = chart.bars
    assert bar.title == "2026-11-22 a: $0.000669"


@pytest.mark.parametrize("peak", ["0.000027", "0.0009", "0.013", "0.75", "0.9", "3", "42.5", "950"])
def test_the_axis_covers_the_busiest_day_with_ticks_of_one_precision(peak):
    chart = spend_chart({(TODAY, "a"): Decimal(peak)}, days=30, today=TODAY)
    texts = [t.text for t in chart.y_ticks]
    assert len({len(text.split(".")[1]) for text in texts}) == 1, texts
    assert Decimal(texts[-1].lstrip("$")) >= Decimal(peak), texts


@pytest.mark.parametrize(
    "amount, shown",
    [
        (Decimal("5"), "$5.00"),
        (Decimal("4.5"), "$4.50"),
        (Decimal("0.0001"), "$0.0001"),
        (Decimal("0.0000064"), "$0.000006"),
        (Decimal("-0.25"), "−$0.25"),
        (Decimal("1234.5678"), "$1234.5678"),
    ],
)
def test_amounts_show_up_to_six_decimals(amount, shown):
    assert format_usd(amount) == shown


@pytest.mark.parametrize(
    "column, shown",
    [
        (["0", "0.000669"], ["$0.000000", "$0.000669"]),
        (["5", "0.5", None], ["$5.00", "$0.50", ""]),
        (["5", "0.0001", "-0.25"], ["$5.0000", "$0.0001", "−$0.2500"]),
        (["0.0000064", "1"], ["$0.000006", "$1.000000"]),
        ([], []),
    ],
)
def test_amounts_shown_together_share_the_decimals_the_most_precise_needs(column, shown):
    amounts = [None if a is None else Decimal(a) for a in column]
    places = usd_places(amounts)
    assert [format_usd(a, places) for a in amounts] == shown
    assert 2 <= places <= 6


@pytest.mark.parametrize("raw", ["-1", "abc", "NaN", "Infinity", "1e400", "0.00000000001"])
def test_a_bad_amount_is_refused(raw):
    with pytest.raises(ValidationError):
        parse_usd(raw, allow_zero=True)


def test_amounts_parse_exactly():
    assert parse_usd(" $2.50 ", allow_zero=False) == Decimal("2.50")
    assert parse_usd("", allow_zero=False) is None
    assert parse_usd("0", allow_zero=True) == 0
    with pytest.raises(ValidationError):
        parse_usd("0", allow_zero=False)


@pytest.mark.parametrize(
    "name, personal_of, viewer, shown",
    [
        ("Acme", None, "a@example.com", "Acme"),
        ("a@example.com", "a@example.com", "a@example.com", "your personal organisation"),
        ("a@example.com", "a@example.com", "A@Example.com", "your personal organisation"),
        ("a@example.com", "a@example.com", "b@example.com", "a@example.com's organisation"),
        ("a@example.com", "a@example.com", None, "a@example.com's organisation"),
        ("Renamed", "a@example.com", "a@example.com", "Renamed"),
    ],
)
def test_an_organisation_named_after_its_holder_is_not_read_as_a_person(
    name, personal_of, viewer, shown
):
    assert organisation_label(name, personal_of, viewer) == shown
