"""Money is rounded once, half up, to the resolution balances keep, and stored in units."""

from decimal import Decimal

import pytest

from app.money import UNITS_PER_USD, money_units, to_money, usd_text


def test_costs_round_half_up_at_the_money_quantum():
    assert to_money(Decimal("0.00000000015")) == Decimal("0.0000000002")
    assert to_money(Decimal("0.000000000149")) == Decimal("0.0000000001")


def test_an_amount_is_stored_as_its_count_of_the_quantum():
    assert money_units(Decimal("1.5")) == 15_000_000_000
    assert money_units(Decimal("0.00000000015")) == 2
    assert money_units(0) == 0
    assert money_units(None) is None


@pytest.mark.parametrize("units", [0, 1, 5, 8_000_000, 15 * 10**9, 10**10, 123_456_789_012_345])
def test_usd_text_prints_units_as_the_amount_prints(units):
    assert usd_text(units) == f"{Decimal(units) / UNITS_PER_USD:f}"
