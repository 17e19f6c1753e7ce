"""The one pricing function: USD cost of token usage at catalog prices, exact.

Prices are USD per million tokens, as providers publish them, held as Decimal from the
moment the catalog is parsed. Costs are rounded once, to MONEY_QUANTUM, the resolution
at which balances are stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from app.money import to_money
from app.providers.base import Usage

PER_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Pricing:
    """USD per million tokens of each kind; prompt-cache writes cost as prompt unless priced."""

    prompt: Decimal
    completion: Decimal
    cached_read: Decimal
    image: Decimal
    cache_write: Decimal | None = None

    def __post_init__(self) -> None:
        """Price cache writes as the prompt when the catalog gives them no price."""
        if self.cache_write is None:
            object.__setattr__(self, "cache_write", self.prompt)

    def to_dict(self) -> dict[str, Decimal]:
        """Render for GET /v1/models and the CLI."""
        return {
            "prompt": self.prompt,
            "completion": self.completion,
            "cached_read": self.cached_read,
            "image": self.image,
            "cache_write": self.cache_write,
        }


def cost_of(usage: Usage, pricing: Pricing) -> Decimal:
    """Return the USD cost of ``usage``.

    Cached, cache-write and image tokens are part of ``prompt_tokens`` and priced at their
    own rates; the rest of the prompt at the prompt rate. Every completion token, reasoning and
    image tokens included, is priced at the completion rate.
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
        + usage.cache_write_tokens * pricing.cache_write
        + usage.prompt_image_tokens * pricing.image
        + usage.completion_tokens * pricing.completion
    )
    return to_money(micro_usd / PER_MILLION)


def worst_case_cost(*, prompt_tokens: int, completion_tokens: int, pricing: Pricing) -> Decimal:
    """Return the most a request can cost: every prompt token at the highest prompt-side rate."""
    prompt_rate = max(pricing.prompt, pricing.cached_read, pricing.image, pricing.cache_write)
    micro_usd = prompt_tokens * prompt_rate + completion_tokens * pricing.completion
    return to_money(micro_usd / PER_MILLION)


def affordable_completion_tokens(*, budget: Decimal, prompt_tokens: int, pricing: Pricing) -> int:
    """Return the largest completion token count whose worst case fits in ``budget``."""
    prompt_cost = worst_case_cost(prompt_tokens=prompt_tokens, completion_tokens=0, pricing=pricing)
    left = budget - prompt_cost
    if left < 0:
        return 0
    if pricing.completion == 0:
        return 2**31 - 1
    return int(left * PER_MILLION / pricing.completion)
