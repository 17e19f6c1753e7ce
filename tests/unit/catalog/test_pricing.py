from decimal import Decimal

import pytest

from app.catalog.pricing import (
    Pricing,
    Surcharges,
    affordable_completion_tokens,
    cost_of,
    worst_case_cost,
)
from app.providers.base import Usage

# Prices small enough that any float arithmetic or early rounding would show.
TINY = Pricing(
    prompt=Decimal("0.0123"),
    completion=Decimal("0.0457"),
    cached_read=Decimal("0.0011"),
    image=Decimal("0.0333"),
)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (Usage(prompt_tokens=1), Decimal("0.0000000123")),
        (Usage(completion_tokens=1), Decimal("0.0000000457")),
        (Usage(prompt_tokens=7, cached_tokens=7), Decimal("0.0000000077")),
        (Usage(prompt_tokens=3, prompt_image_tokens=3), Decimal("0.0000000999")),
        # reasoning tokens are completion tokens: priced once, at the completion rate
        (Usage(completion_tokens=10, reasoning_tokens=6), Decimal("0.000000457")),
        (
            Usage(
                prompt_tokens=1000, cached_tokens=600, prompt_image_tokens=85, completion_tokens=333
            ),
            # 315*0.0123 + 600*0.0011 + 85*0.0333 + 333*0.0457 = 22.5831 micro-USD
            Decimal("0.0000225831"),
        ),
        (Usage(), Decimal(0)),
    ],
)
def test_cost_applies_each_rate_exactly(usage, expected):
    assert cost_of(usage, TINY) == expected


def test_cost_is_exact_where_floats_are_not():
    pricing = Pricing(Decimal("0.1"), Decimal("0.2"), Decimal("0.1"), Decimal("0.1"))
    usage = Usage(prompt_tokens=3, completion_tokens=3)
    assert 3 * 0.1 / 1e6 + 3 * 0.2 / 1e6 != 0.0000009  # the float answer is off
    assert cost_of(usage, pricing) == Decimal("0.0000009")


def test_worst_case_prices_the_prompt_at_its_dearest_rate():
    worst = worst_case_cost(prompt_tokens=100, completion_tokens=10, pricing=TINY)
    assert worst == Decimal("0.00000333") + Decimal("0.000000457")


def test_affordable_completion_tokens_fit_the_budget():
    budget = Decimal("0.00001")
    tokens = affordable_completion_tokens(budget=budget, prompt_tokens=100, pricing=TINY)
    assert worst_case_cost(prompt_tokens=100, completion_tokens=tokens, pricing=TINY) <= budget
    assert worst_case_cost(prompt_tokens=100, completion_tokens=tokens + 1, pricing=TINY) > budget


def test_nothing_is_affordable_when_the_prompt_exceeds_the_budget():
    assert affordable_completion_tokens(budget=Decimal("0"), prompt_tokens=10, pricing=TINY) == 0


def test_prompt_cache_writes_are_priced_at_their_own_rate():
    pricing = Pricing(
        Decimal("3"), Decimal("15"), Decimal("0.30"), Decimal("3"), cache_write=Decimal("3.75")
    )
    usage = Usage(prompt_tokens=1000, cached_tokens=200, cache_write_tokens=300)
    # 500 plain at 3, 200 read at 0.30, 300 written at 3.75, per million.
    assert cost_of(usage, pricing) == Decimal("0.0015") + Decimal("0.00006") + Decimal("0.001125")


def test_cache_writes_cost_as_the_prompt_unless_priced():
    pricing = Pricing(Decimal("3"), Decimal("15"), Decimal("0.30"), Decimal("3"))
    assert pricing.cache_write == Decimal("3")
    assert worst_case_cost(prompt_tokens=10, completion_tokens=0, pricing=pricing) == Decimal(
        "0.00003"
    )


CLAUDE = Pricing(
    Decimal("3"),
    Decimal("15"),
    Decimal("0.30"),
    Decimal("3"),
    cache_write=Decimal("3.75"),
    cache_write_1h=Decimal("6"),
    tool_calls={"web_search": Decimal("0.01"), "code_execution": Decimal("0.03")},
    tiers={"priority": Decimal("2")},
)


def test_hour_long_cache_writes_are_priced_at_their_own_rate():
    usage = Usage(prompt_tokens=1000, cache_write_tokens=300, cache_write_1h_tokens=100)
    # 700 plain at 3, 200 written for 5 minutes at 3.75, 100 for an hour at 6, per million.
    assert cost_of(usage, CLAUDE) == Decimal("0.0021") + Decimal("0.00075") + Decimal("0.0006")


def test_tool_calls_are_priced_per_call_and_a_tier_multiplies_everything_once():
    usage = Usage(prompt_tokens=1, completion_tokens=1, tool_calls={"web_search": 3})
    # (3 + 15) per million, plus 3 searches at 0.01, all twice over, rounded once.
    assert cost_of(usage, CLAUDE) == Decimal("0.030018")
    assert cost_of(usage, CLAUDE, Decimal(2)) == Decimal("0.060036")
    # Half a tenth of a billionth, times a third: rounded once, at the end.
    tiny = Pricing(Decimal("0.00005"), Decimal(0), Decimal(0), Decimal(0))
    assert cost_of(Usage(prompt_tokens=1), tiny, Decimal("1.5")) == Decimal("1E-10")


def test_the_worst_case_holds_the_tools_calls_at_the_tiers_multiplier():
    surcharges = Surcharges(tier="priority", tool_calls={"web_search": 5, "code_execution": 1})
    worst = worst_case_cost(
        prompt_tokens=1000, completion_tokens=100, pricing=CLAUDE, surcharges=surcharges
    )
    # Every prompt token at the highest prompt rate (6), 100 at 15; 5 x 0.01 + 0.03; x2.
    assert worst == (Decimal("0.006") + Decimal("0.0015") + Decimal("0.08")) * 2
    assert worst_case_cost(prompt_tokens=1000, completion_tokens=100, pricing=CLAUDE) == Decimal(
        "0.0075"
    )


def test_the_default_tiers_cost_one_unless_priced():
    assert CLAUDE.tier_multiplier(None) == CLAUDE.tier_multiplier("auto") == Decimal(1)
    assert CLAUDE.tier_multiplier("standard") == CLAUDE.tier_multiplier("default") == 1
    assert CLAUDE.tier_multiplier("flex") is None
    assert Pricing(1, 1, 1, 1, tiers={"default": Decimal("1.1")}).tier_multiplier("default") == (
        Decimal("1.1")
    )
