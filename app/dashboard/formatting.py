"""How the dashboard writes amounts of money, windows and CSV cells.

One rule for money: amounts shown together (a table's column, a row of figures, an
axis) share one number of decimals, the fewest that write every one of them exactly to
the micro-dollar, at least 2 and at most 6. So $0.000000 stands beside $0.000669, never
$0.00; a column of whole cents stays $5.00. An amount alone takes the decimals it needs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from decimal import ROUND_HALF_EVEN, Decimal

from app.budgets import DAY, FIVE_HOURS, MONTH, WEEK

FEWEST_PLACES, MOST_PLACES = 2, 6
SHOWN_QUANTUM = Decimal(1).scaleb(-MOST_PLACES)
WINDOW_NAMES = {MONTH: "month", WEEK: "week", DAY: "day", FIVE_HOURS: "5 hours"}
CURRENT_WINDOWS = {MONTH: "this month", WEEK: "this week", DAY: "today", FIVE_HOURS: "in 5 hours"}


def _shown(amount: Decimal) -> Decimal:
    return Decimal(amount).quantize(SHOWN_QUANTUM, rounding=ROUND_HALF_EVEN)


def _places_of(amount: Decimal) -> int:
    """Return the decimals ``amount`` needs, once rounded to the micro-dollar."""
    exponent = _shown(amount).normalize().as_tuple().exponent
    assert isinstance(exponent, int)  # a finite amount
    return min(max(-exponent, FEWEST_PLACES), MOST_PLACES)


def usd_places(amounts: Iterable[Decimal | None]) -> int:
    """Return the decimals that write each of ``amounts`` exactly: 2 to 6."""
    return max((_places_of(a) for a in amounts if a is not None), default=FEWEST_PLACES)


def format_usd(amount: Decimal | None, places: int | None = None) -> str:
    """Write ``amount`` as ``$1.50``, with ``places`` decimals (default: those it needs).

    Pass the ``usd_places`` of the amounts shown beside it, so they line up.
    """
    if amount is None:
        return ""
    places = usd_places([amount]) if places is None else places
    shown = _shown(amount).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
    sign = "−" if shown < 0 else ""
    return f"{sign}${abs(shown):f}"


def window_name(window: str) -> str:
    """Name a budget window in words: ``month``, ``week``, ``day`` or ``5 hours``."""
    return WINDOW_NAMES.get(window, window)


def current_window(window: str) -> str:
    """Name the window a spend is counted in: ``this month`` ... ``in 5 hours``."""
    return CURRENT_WINDOWS.get(window, window)


NEEDS_QUOTES = re.compile('[,"\r\n]')


def csv_text(value: str) -> str:
    """Return ``value`` kept as text by spreadsheets: a leading formula character is quoted."""
    # A cell starting like a formula would run as one in a spreadsheet; a quote keeps it text.
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def csv_cell(value: str) -> str:
    """Return ``value`` as csv.writer writes a cell (QUOTE_MINIMAL, the default dialect)."""
    if NEEDS_QUOTES.search(value):
        return '"' + value.replace('"', '""') + '"'
    return value
