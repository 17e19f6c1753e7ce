"""Money: USD as exact Decimal in the code, rounded once, to the resolution balances keep.

Balances, holds and charges are stored as integer counts of MONEY_QUANTUM (1e-10 USD),
so that every balance check is an exact integer comparison, on SQLite too.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

MONEY_QUANTUM = Decimal("1e-10")
UNITS_PER_USD = int(1 / MONEY_QUANTUM)
# The most a Money column holds: a signed 64-bit count of MONEY_QUANTUM, 922337203.6854775807.
MAX_MONEY = (2**63 - 1) * MONEY_QUANTUM


def exact_money(amount: Decimal) -> bool:
    """Tell whether ``amount`` is a whole number of MONEY_QUANTUM, which to_money keeps as is."""
    return amount == to_money(amount)


def to_money(amount: Decimal) -> Decimal:
    """Round an exact amount to the resolution balances are kept at."""
    # The rounding by position: by keyword, the C method's parsing of its arguments costs
    # a third of the call, and every amount a request writes is rounded here.
    return amount.quantize(MONEY_QUANTUM, ROUND_HALF_UP)


def money_units(value: Decimal | int | None) -> int | None:
    """Return ``value`` USD as the count of MONEY_QUANTUM stored for it (rounded by to_money)."""
    if value is None:
        return None
    if type(value) is not Decimal:  # a Decimal is rounded as it is, not copied first
        value = Decimal(value)
    return int(to_money(value) * UNITS_PER_USD)


def usd_text(units: int) -> str:
    """Return ``units`` of MONEY_QUANTUM as USD text, as ``f"{amount:f}"`` prints the amount.

    Integer arithmetic only: for exports that print many amounts read as stored.
    """
    whole, fraction = divmod(units, UNITS_PER_USD)
    if not fraction:
        return str(whole)
    return f"{whole}.{fraction:010d}".rstrip("0")
