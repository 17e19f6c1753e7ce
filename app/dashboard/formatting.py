"""How the dashboard writes amounts of money."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

SHOWN_QUANTUM = Decimal("0.000001")


def format_usd(amount: Decimal | None) -> str:
    """Write ``amount`` as ``$1.50`` or ``$0.000123``: up to 6 decimals, at least 2."""
    if amount is None:
        return ""
    shown = Decimal(amount).quantize(SHOWN_QUANTUM, rounding=ROUND_HALF_EVEN)
    sign = "−" if shown < 0 else ""
    text = f"{abs(shown):f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{sign}${whole}.{fraction.ljust(2, '0')}"
