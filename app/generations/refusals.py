"""Why a request cannot run as asked: what its model cannot take, what its balance cannot cover.

Checked before anything is held or run; each refusal says what to change.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

from app.budgets import DAY, FIVE_HOURS, MONTH, WEEK
from app.catalog.errors import CapabilityMissing
from app.catalog.pricing import NO_SURCHARGES, Surcharges, affordable_completion_tokens
from app.catalog.registry import Model
from app.credits.balances import KEY_BUDGET, BudgetShortfall, Shortfall
from app.credits.errors import AccountInDebt, InsufficientCredits
from app.generations.errors import (
    ContextLengthExceeded,
    OutputLimitExceeded,
    UnpricedSurcharge,
    UnsupportedContent,
)
from app.generations.prompts import Prompt
from app.providers.base import ChatRequest, EmbeddingRequest, PromptContent
from app.providers.openai_compat import WEB_SEARCH_OPTIONS

TOOL_PARAMS = ("tools", "tool_choice", "parallel_tool_calls")


def prompt_tokens_within_context(prompt: Prompt, model: Model) -> int:
    """Count the prompt's tokens; raise ContextLengthExceeded past the context length.

    Counting stops as soon as the count passes the context length, so a huge prompt
    costs no more to refuse than one just too long.
    """
    tokens = prompt.count(limit=model.context_length)
    if tokens > model.context_length:
        raise ContextLengthExceeded(
            f"The prompt is longer than model '{model.id}' takes: it has more than "
            f"{model.context_length} tokens.",
            param="messages",
            tokens=tokens,
            limit=model.context_length,
        )
    return tokens


# The most inputs one embeddings request may hold, on every door (OpenAI's limit).
MAX_EMBEDDING_INPUTS = 2048


def inputs_within_context(
    request: EmbeddingRequest, model: Model, *, item_name: str = "input[{index}]"
) -> None:
    """Refuse an input longer than the model's context length: each is embedded alone.

    A text is tokenized only when its cheap bound passes the limit, and then only up to it.
    ``item_name`` names an input as the door's body does (``{index}``: its position).
    """
    route = model.routes[0]
    adapter, target, limit = route.adapter, route.target, model.context_length
    inputs = request.inputs
    if inputs and type(inputs[0]) is str:
        # The texts' bound together is at least each one's (their sizes, or their counts,
        # added up): within the limit, every text is. The inputs are all of one kind.
        together = PromptContent(texts=inputs)  # type: ignore[arg-type]
        if adapter.content_token_bound(together, target) <= limit:
            return
    for index, item in enumerate(inputs):
        if type(item) is list:
            tokens = len(item)
        else:
            content = PromptContent(texts=[item])
            if adapter.content_token_bound(content, target) <= limit:
                continue
            tokens = adapter.count_content_tokens(content, target, limit=limit)
        if tokens > limit:
            name = item_name.format(index=index)
            raise ContextLengthExceeded(
                f"{name} is longer than model '{model.id}' takes: it has more than {limit} tokens.",
                param=name,
                tokens=tokens,
                limit=limit,
            )


def check_dimensions(request: EmbeddingRequest, model: Model, *, param: str = "dimensions") -> None:
    """Refuse a vector size on a model whose catalog entry does not say it takes one."""
    if request.dimensions is not None and "dimensions" not in model.capabilities:
        raise CapabilityMissing(
            f"Model '{model.id}' does not take {param}: its vectors have one size.",
            param=param,
        )


def fit_request_to_model(request: ChatRequest, model: Model) -> ChatRequest:
    """Refuse what the model cannot take; drop tool fields a model without tools ignores."""
    if "vision" not in model.capabilities:
        _refuse_images(request, model)
    requested_output = request.max_output_tokens
    if requested_output is not None and requested_output > model.max_output_tokens:
        param = (
            "max_completion_tokens" if "max_completion_tokens" in request.params else "max_tokens"
        )
        raise OutputLimitExceeded(
            f"{param} is too large: {requested_output}. Model '{model.id}' produces at most "
            f"{model.max_output_tokens} completion tokens.",
            param=param,
        )
    if "tools" not in model.capabilities and any(p in request.params for p in TOOL_PARAMS):
        params = {k: v for k, v in request.params.items() if k not in TOOL_PARAMS}
        request = replace(request, params=params)
    return request


def forwarded_surcharges(request: ChatRequest, model: Model) -> Surcharges:
    """Return the tier and web search a chat request asks for, where its routes forward them.

    ``service_tier`` and ``web_search_options`` are no fields of the contract: they reach
    an upstream only as extra parameters that the model's catalog entry lets through. A
    search model searches once for a request with ``web_search_options``: one call of
    ``web_search``.
    """
    extra = request.extra
    if not extra:
        return NO_SURCHARGES
    tier = extra.get("service_tier")
    if type(tier) is not str or not _forwarded("service_tier", model):
        tier = None
    searches = WEB_SEARCH_OPTIONS in extra and _forwarded(WEB_SEARCH_OPTIONS, model)
    if tier is None and not searches:
        return NO_SURCHARGES
    calls = {"web_search": 1} if searches else {}
    return Surcharges(tier=tier, tool_calls=calls, tools_param=WEB_SEARCH_OPTIONS)


def _forwarded(param: str, model: Model) -> bool:
    return any(param in route.target.extra_params for route in model.routes)


def check_surcharges(surcharges: Surcharges, model: Model) -> None:
    """Refuse a service tier or hosted tool that the model's catalog entry does not price."""
    if surcharges is NO_SURCHARGES:
        return
    pricing = model.pricing
    if pricing.tier_multiplier(surcharges.tier) is None:
        priced = ", ".join(sorted(pricing.tiers)) or "none beyond the default"
        raise UnpricedSurcharge(
            f"service_tier {surcharges.tier!r} is not offered for model '{model.id}' "
            f"(its priced tiers: {priced}).",
            param="service_tier",
        )
    for tool in surcharges.tool_calls:
        if tool not in pricing.tool_calls:
            priced = ", ".join(sorted(pricing.tool_calls)) or "none"
            raise UnpricedSurcharge(
                f"The hosted tool {tool!r} is not offered for model '{model.id}' "
                f"(its priced tools: {priced}).",
                param=surcharges.tools_param,
            )


def _refuse_images(request: ChatRequest, model: Model) -> None:
    for i, message in enumerate(request.messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if part.get("type") == "image_url":
                raise UnsupportedContent(
                    f"Model '{model.id}' does not accept image input.",
                    param=f"messages[{i}].content[{j}]",
                )


def insufficient_credits(
    shortfall: Shortfall | BudgetShortfall,
    *,
    model: Model,
    request: ChatRequest,
    prompt_tokens: int,
    surcharges: Surcharges = NO_SURCHARGES,
) -> InsufficientCredits:
    """Explain a refused hold, with the largest max_tokens the balance (or key) would cover.

    An account in debt is refused as such, whatever the request would cost.
    """
    if isinstance(shortfall, Shortfall) and shortfall.in_debt:
        return AccountInDebt(shortfall.balance)
    affordable = (
        affordable_completion_tokens(
            budget=shortfall.available,
            prompt_tokens=prompt_tokens,
            pricing=model.pricing,
            surcharges=surcharges,
        )
        // request.choice_count
    )
    if isinstance(shortfall, BudgetShortfall):
        return _budget_refusal(shortfall, affordable)
    message = (
        f"Insufficient credits: this request may cost up to ${shortfall.requested:f} "
        f"but the available balance is ${max(shortfall.available, Decimal(0)):f}."
    )
    if affordable > 0:
        return InsufficientCredits(message, affordable=affordable, then="or add credits.")
    return InsufficientCredits(message + " Add credits to continue.")


# How a refusal names a budget's window, and the window after it.
_WINDOW_NAMES = {
    DAY: ("daily", "the next day (UTC)"),
    WEEK: ("weekly", "the next week (UTC, from Monday)"),
    MONTH: ("monthly", "the next month"),
    FIVE_HOURS: ("5-hour", "the next 5-hour window"),
}


def _budget_refusal(shortfall: BudgetShortfall, affordable: int) -> InsufficientCredits:
    """Say which budget refused the hold (the key's or its member's), and what it leaves."""
    period, next_window = _WINDOW_NAMES[shortfall.window]
    left = "this month (UTC)" if shortfall.window == MONTH else "in this window"
    if shortfall.holder == KEY_BUDGET:
        limit, holder, raised = f"this API key's {period} limit", "the key", "the key's limit"
    else:
        limit, holder, raised = f"the member's {period} budget", "the member", "the budget"
    message = (
        f"Insufficient credits under {limit} of ${shortfall.budget:f}: this request may "
        f"cost up to ${shortfall.requested:f} but {holder} has ${shortfall.available:f} "
        f"left {left}."
    )
    if affordable > 0:
        return InsufficientCredits(message, affordable=affordable, then=f"or raise {raised}.")
    return InsufficientCredits(message + f" Raise {raised} or wait for {next_window}.")


class output_field_named:
    """Name the output cap in a refusal raised inside as the door's ``output_field``.

    A class rather than a generator: it is entered by every request.
    """

    __slots__ = ("output_field",)

    def __init__(self, output_field: str) -> None:
        self.output_field = output_field

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if isinstance(error, InsufficientCredits):
            error.name_output_field(self.output_field)
        return False
