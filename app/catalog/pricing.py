"""The one pricing function: USD cost of a generation's usage at catalog prices, exact.

Token prices are USD per million tokens, as providers publish them; a hosted tool's price
is USD per call; a service tier's is a multiplier of every price. All are held as Decimal
from the moment the catalog is parsed. Costs are rounded once, to MONEY_QUANTUM, the
resolution at which balances are stored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from app.money import to_money
from app.providers.base import Usage

PER_MILLION = Decimal(1_000_000)
ONE = Decimal(1)
# The hosted and server tools an upstream bills per call, by the name the catalog prices
# them under (``pricing.tool_calls``). docs/pricing.md says what counts as a call of each.
PRICED_TOOLS = frozenset(
    {
        "web_search",
        "web_fetch",
        "file_search",
        "code_interpreter",
        "code_execution",
        "image_generation",
        "mcp",
        "container",
    }
)
# The tiers that are an upstream's ordinary service: priced at 1 unless the catalog says.
BASE_TIERS = frozenset({"auto", "default", "standard", "standard_only"})
# The calls of a hosted tool a hold covers when the request sets no limit of its own
# (Anthropic's ``max_uses``, the Responses API's ``max_tool_calls``). A charge is never
# capped at its hold: more calls are charged as the balance allows, the rest recorded.
DEFAULT_CALLS_HELD = 10


@dataclass(frozen=True)
class Pricing:
    """A model's prices: per million tokens of each kind, per hosted tool call, per tier.

    Prompt-cache writes cost as the prompt unless priced; writes with a 1-hour TTL as
    the 5-minute ones unless priced. ``tool_calls`` is USD per call of each priced tool;
    ``tiers`` the multiplier of every price for each priced service tier.
    """

    prompt: Decimal
    completion: Decimal
    cached_read: Decimal
    image: Decimal
    cache_write: Decimal | None = None
    cache_write_1h: Decimal | None = None
    tool_calls: Mapping[str, Decimal] = field(default_factory=dict)
    tiers: Mapping[str, Decimal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Price cache writes as the prompt, and 1-hour ones as 5-minute ones, unless priced."""
        if self.cache_write is None:
            object.__setattr__(self, "cache_write", self.prompt)
        if self.cache_write_1h is None:
            object.__setattr__(self, "cache_write_1h", self.cache_write)

    def tier_multiplier(self, tier: str | None) -> Decimal | None:
        """Return what every price is multiplied by in ``tier``; None if it is not priced."""
        if tier is None:
            return ONE
        multiplier = self.tiers.get(tier)
        if multiplier is None and tier in BASE_TIERS:
            return ONE
        return multiplier

    def to_dict(self) -> dict[str, Any]:
        """Render for GET /v1/models and the CLI; tools and tiers only when priced."""
        prices: dict[str, Any] = {
            "prompt": self.prompt,
            "completion": self.completion,
            "cached_read": self.cached_read,
            "image": self.image,
            "cache_write": self.cache_write,
            "cache_write_1h": self.cache_write_1h,
        }
        if self.tool_calls:
            prices["tool_calls"] = dict(self.tool_calls)
        if self.tiers:
            prices["tiers"] = dict(self.tiers)
        return prices


@dataclass(frozen=True)
class Surcharges:
    """What a request may be billed for beyond its tokens, as it asks for it.

    ``tier`` is the service tier it asks for (None: the upstream's default);
    ``tool_calls`` the priced tools it offers, each with the most calls its hold covers.
    """

    tier: str | None = None
    tool_calls: Mapping[str, int] = field(default_factory=dict)
    # The request's field that asks for the tools, named in a refusal.
    tools_param: str = "tools"


NO_SURCHARGES = Surcharges()


def calls_held(limit: Any) -> int:
    """Return the calls of a tool a hold covers: the request's ``limit``, else the default."""
    return limit if type(limit) is int and limit > 0 else DEFAULT_CALLS_HELD


def cost_of(usage: Usage, pricing: Pricing, multiplier: Decimal = ONE) -> Decimal:
    """Return the USD cost of ``usage``, every price multiplied by its tier's ``multiplier``.

    Cached, cache-write and image tokens are part of ``prompt_tokens`` and priced at their
    own rates (1-hour cache writes at theirs); the rest of the prompt at the prompt rate.
    Every completion token, reasoning and image tokens included, is priced at the
    completion rate. Each hosted tool call the usage reports is priced per call; a tool
    the catalog does not price was never asked for, and costs nothing.
    """
    plain_prompt = (
        usage.prompt_tokens
        - usage.cached_tokens
        - usage.cache_write_tokens
        - usage.prompt_image_tokens
    )
    micro_usd = (
        max(plain_prompt, 0) * pricing.prompt
        + usage.cached_tokens * pricing.cached_read
        + (usage.cache_write_tokens - usage.cache_write_1h_tokens) * pricing.cache_write
        + usage.cache_write_1h_tokens * pricing.cache_write_1h
        + usage.prompt_image_tokens * pricing.image
        + usage.completion_tokens * pricing.completion
    )
    usd = micro_usd / PER_MILLION
    if usage.tool_calls:
        usd += tool_calls_cost(usage.tool_calls, pricing.tool_calls)
    if multiplier != ONE:
        usd *= multiplier
    return to_money(usd)


def tool_calls_cost(calls: Mapping[str, int], prices: Mapping[str, Any]) -> Decimal:
    """Return the exact USD of ``calls`` (tool: count) at ``prices`` (tool: USD per call)."""
    return sum((count * Decimal(prices.get(tool, 0)) for tool, count in calls.items()), Decimal(0))


def worst_case_cost(
    *,
    prompt_tokens: int,
    completion_tokens: int,
    pricing: Pricing,
    surcharges: Surcharges = NO_SURCHARGES,
) -> Decimal:
    """Return the most a request can cost: every prompt token at the highest prompt-side rate.

    The tools it offers are counted at the most calls its hold covers, all of it at its
    tier's multiplier (a tier the catalog does not price is refused before this).
    """
    prompt_rate = max(
        pricing.prompt,
        pricing.cached_read,
        pricing.image,
        pricing.cache_write,
        pricing.cache_write_1h,
    )
    micro_usd = prompt_tokens * prompt_rate + completion_tokens * pricing.completion
    usd = micro_usd / PER_MILLION
    if surcharges is NO_SURCHARGES:
        return to_money(usd)
    if surcharges.tool_calls:
        usd += tool_calls_cost(surcharges.tool_calls, pricing.tool_calls)
    multiplier = pricing.tier_multiplier(surcharges.tier)
    return to_money(usd * multiplier) if multiplier is not None else to_money(usd)


def affordable_completion_tokens(
    *,
    budget: Decimal,
    prompt_tokens: int,
    pricing: Pricing,
    surcharges: Surcharges = NO_SURCHARGES,
) -> int:
    """Return the largest completion token count whose worst case fits in ``budget``."""
    prompt_cost = worst_case_cost(
        prompt_tokens=prompt_tokens, completion_tokens=0, pricing=pricing, surcharges=surcharges
    )
    left = budget - prompt_cost
    if left < 0:
        return 0
    rate = pricing.completion * (pricing.tier_multiplier(surcharges.tier) or ONE)
    if rate == 0:
        return 2**31 - 1
    return int(left * PER_MILLION / rate)
