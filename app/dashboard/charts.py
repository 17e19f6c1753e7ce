"""The usage page's chart: daily spend per model, as stacked bars laid out for SVG."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from app.dashboard.formatting import format_usd, usd_places

PALETTE = ("#2563eb", "#16a34a", "#d97706", "#9333ea", "#dc2626", "#0891b2", "#4b5563")
WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, BOTTOM, TOP = 76, 24, 24, 12


@dataclass(frozen=True)
class Bar:
    """One model's spend on one day: a rectangle and its tooltip."""

    x: float
    y: float
    width: float
    height: float
    color: str
    title: str


@dataclass(frozen=True)
class Tick:
    """A label on an axis."""

    x: float
    y: float
    text: str


@dataclass(frozen=True)
class SpendChart:
    """Everything the template draws: bars, axis labels and the legend."""

    width: int
    height: int
    bars: list[Bar]
    x_ticks: list[Tick]
    y_ticks: list[Tick]
    legend: list[tuple[str, str]]
    total: Decimal
    plot_left: int
    plot_right: int
    plot_bottom: int


def _scale_top(peak: Decimal) -> Decimal:
    """Round the largest day up to an even multiple of its leading digit's power of ten.

    The axis is labelled at 0, half the top and the top: an even multiple keeps the half
    on that power too, so the three ticks share their decimals ($0.0000, $0.0004,
    $0.0008; never $0.0005 beside $0.001).
    """
    if peak <= 0:
        return Decimal("0.02")  # an empty axis reads $0.00, $0.01, $0.02
    step = Decimal(10) ** (peak.adjusted())
    for multiple in (2, 4, 6, 8):
        if peak <= step * multiple:
            return step * multiple
    return step * 10


def _day_bars(
    spend: dict[tuple[date, str], Decimal], day: date, x: float, width: float, scale: Scale
) -> list[Bar]:
    bars, base = [], float(HEIGHT - BOTTOM)
    for model, color in scale.colors.items():
        cost = spend.get((day, model), Decimal(0))
        if cost <= 0:
            continue
        height = max(float(cost / scale.top) * scale.plot_height, 1.0)
        base -= height
        title = f"{day.isoformat()} {model}: {format_usd(cost)}"
        bars.append(Bar(x, base, width, height, color, title))
    return bars


@dataclass(frozen=True)
class Scale:
    """The y axis's top value, the plot's height in pixels, and each model's color."""

    top: Decimal
    plot_height: int
    colors: dict[str, str]


def spend_chart(spend: dict[tuple[date, str], Decimal], *, days: int, today: date) -> SpendChart:
    """Lay out ``spend`` (cost per day and model) as one stacked bar per day."""
    dates = [today - timedelta(days=days - 1 - i) for i in range(days)]
    models = sorted({model for _, model in spend})
    per_day = {day: Decimal(0) for day in dates}
    for (day, _), cost in spend.items():
        if day in per_day:
            per_day[day] += cost
    scale = Scale(
        top=_scale_top(max(per_day.values(), default=Decimal(0))),
        plot_height=HEIGHT - BOTTOM - TOP,
        colors={model: PALETTE[i % len(PALETTE)] for i, model in enumerate(models)},
    )
    slot = (WIDTH - LEFT - RIGHT) / days
    bars = [
        bar
        for i, day in enumerate(dates)
        for bar in _day_bars(spend, day, LEFT + i * slot + 2, slot - 4, scale)
    ]
    x_ticks = [
        Tick(LEFT + i * slot + slot / 2, HEIGHT - 6, day.strftime("%b %d"))
        for i, day in enumerate(dates)
        if (days - 1 - i) % 7 == 0
    ]
    shares = (Decimal(0), Decimal("0.5"), Decimal(1))
    places = usd_places(scale.top * share for share in shares)
    y_ticks = [
        Tick(
            LEFT - 6,
            HEIGHT - BOTTOM - float(share) * scale.plot_height + 4,
            format_usd(scale.top * share, places),
        )
        for share in shares
    ]
    return SpendChart(
        width=WIDTH,
        height=HEIGHT,
        bars=bars,
        x_ticks=x_ticks,
        y_ticks=y_ticks,
        legend=list(scale.colors.items()),
        total=sum(per_day.values(), Decimal(0)),
        plot_left=LEFT,
        plot_right=WIDTH - RIGHT,
        plot_bottom=HEIGHT - BOTTOM,
    )
