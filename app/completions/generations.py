"""A generation's life: hold its worst case, run it on the model's routes, settle it once.

Streamed and whole answers end in the same ``finish_generation``, which charges the
actual cost and writes the generation record in one transaction, so a caller that
disconnects mid-stream is still billed exactly once, for what was produced.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from sqlalchemy import insert

from app.auth.keys import Caller, key_use_records
from app.catalog.registry import Model
from app.completions.errors import ContextLengthExceeded, OutputLimitExceeded, UnsupportedContent
from app.completions.models import Generation as GenerationRecord
from app.credits.errors import InsufficientCredits
from app.credits.ledger import (
    HeldCredit,
    MonthlyLimitShortfall,
    Shortfall,
    extend_hold,
    place_hold,
    settle_hold,
)
from app.credits.pricing import affordable_completion_tokens, cost_of, worst_case_cost
from app.database import BoundStatement, utcnow
from app.providers.base import ChatRequest, Chunk, Completion, Usage
from app.providers.router import complete_on_routes, stream_on_routes

COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
TOOL_PARAMS = ("tools", "tool_choice", "parallel_tool_calls")
# Built once: a statement costs more CPU to construct than to execute.
_INSERT_GENERATION = insert(GenerationRecord.__table__)


@dataclass
class Generation:
    """A request in flight: who pays, what runs, and the credit held for it."""

    id: str
    caller: Caller
    model: Model
    request: ChatRequest
    hold: HeldCredit
    prompt_tokens: int
    hold_ttl_seconds: int
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    hold_renewed: float = field(default_factory=time.monotonic)
    settled: bool = False

    def keep_hold_alive(self) -> None:
        """Push the hold's expiry forward while a long stream is still running.

        Only a dead worker's holds should expire; a stream that outlives the TTL renews
        its hold every third of it, one UPDATE each time, never per chunk.
        """
        now = time.monotonic()
        if now - self.hold_renewed > self.hold_ttl_seconds / 3:
            extend_hold(self.hold, ttl_seconds=self.hold_ttl_seconds)
            self.hold_renewed = now


def start_generation(
    *, caller: Caller, model: Model, request: ChatRequest, hold_ttl_seconds: int
) -> Generation:
    """Fit the request to the model and hold its worst-case cost.

    :raise UnsupportedContent, ContextLengthExceeded, OutputLimitExceeded: 400.
    :raise InsufficientCredits: the available balance cannot cover the worst case.
    """
    request = fit_request_to_model(request, model)
    route = model.routes[0]
    prompt_tokens = route.adapter.count_prompt_tokens(request, route.target)
    if prompt_tokens > model.context_length:
        raise ContextLengthExceeded(
            f"The prompt has {prompt_tokens} tokens; model '{model.id}' takes at most "
            f"{model.context_length}.",
            param="messages",
        )
    completion_tokens = (request.max_output_tokens or model.max_output_tokens) * (
        request.choice_count
    )
    worst = worst_case_cost(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, pricing=model.pricing
    )
    held = place_hold(
        account_id=caller.account_id,
        amount=worst,
        ttl_seconds=hold_ttl_seconds,
        key_id=caller.key_id if caller.monthly_limit is not None else None,
    )
    if isinstance(held, Shortfall | MonthlyLimitShortfall):
        raise insufficient_credits(held, model=model, request=request, prompt_tokens=prompt_tokens)
    return Generation(
        id="chatcmpl-" + secrets.token_hex(12),
        caller=caller,
        model=model,
        request=request,
        hold=held,
        prompt_tokens=prompt_tokens,
        hold_ttl_seconds=hold_ttl_seconds,
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
    shortfall: Shortfall | MonthlyLimitShortfall,
    *,
    model: Model,
    request: ChatRequest,
    prompt_tokens: int,
) -> InsufficientCredits:
    """Explain a refused hold, with the largest max_tokens the balance (or key) would cover."""
    affordable = (
        affordable_completion_tokens(
            budget=shortfall.available, prompt_tokens=prompt_tokens, pricing=model.pricing
        )
        // request.choice_count
    )
    if isinstance(shortfall, MonthlyLimitShortfall):
        return InsufficientCredits(_monthly_limit_message(shortfall, affordable))
    message = (
        f"Insufficient credits: this request may cost up to ${shortfall.requested:f} "
        f"but the available balance is ${max(shortfall.available, Decimal(0)):f}."
    )
    if affordable > 0:
        message += f" Set max_tokens to at most {affordable}, or add credits."
    else:
        message += " Add credits to continue."
    return InsufficientCredits(message)


def _monthly_limit_message(shortfall: MonthlyLimitShortfall, affordable: int) -> str:
    message = (
        f"Insufficient credits under this API key's monthly limit of "
        f"${shortfall.monthly_limit:f}: this request may cost up to ${shortfall.requested:f} "
        f"but the key has ${shortfall.available:f} left this month (UTC)."
    )
    if affordable > 0:
        return message + f" Set max_tokens to at most {affordable}, or raise the key's limit."
    return message + " Raise the key's limit or wait for the next month."


def run_completion(generation: Generation) -> dict[str, Any]:
    """Run the generation to the end, settle it, and return the response body."""
    try:
        completion = complete_on_routes(generation.model.routes, generation.request)
    except BaseException:
        finish_generation(generation, usage=Usage(), status=FAILED, finish_reason=None)
        raise
    finish_reason = completion.choices[0].get("finish_reason") if completion.choices else None
    cost = finish_generation(
        generation, usage=completion.usage, status=COMPLETED, finish_reason=finish_reason
    )
    return completion_body(generation, completion, cost)


def stream_generation(generation: Generation) -> Iterator[dict[str, Any]]:
    """Yield the generation's chunk bodies; settle once, however the stream ends."""
    meter = StreamMeter(generation)
    status = FAILED
    chunks = stream_on_routes(generation.model.routes, generation.request)
    try:
        for chunk in chunks:
            if chunk.usage is not None:
                meter.usage = chunk.usage
            if chunk.choices:
                meter.observe(chunk)
                yield chunk_body(generation, chunk.choices, chunk.system_fingerprint)
                generation.keep_hold_alive()
        meter.complete = True
        status = COMPLETED
        usage = meter.final_usage()
        cost = finish_generation(
            generation, usage=usage, status=status, finish_reason=meter.finish_reason
        )
        if generation.request.include_usage:
            yield usage_chunk_body(generation, usage, cost)
    except GeneratorExit:
        # The server closes the generator when the caller has gone away.
        status = CANCELLED
        raise
    finally:
        # Close the upstream first: a caller who left must not keep it generating while
        # the settlement is written.
        chunks.close()
        if not generation.settled:
            finish_generation(
                generation,
                usage=meter.final_usage(),
                status=status,
                finish_reason=meter.finish_reason,
            )


class StreamMeter:
    """What a stream delivered: the upstream's usage as it arrives, and the text itself."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self.usage: Usage | None = None
        self.complete = False
        self.finish_reason: str | None = None
        self._pieces: list[str] = []

    def observe(self, chunk: Chunk) -> None:
        """Remember the generated text and the finish reason of a delivered chunk."""
        for choice in chunk.choices:
            delta = choice.get("delta") or {}
            for key in ("content", "reasoning"):
                if text := delta.get(key):
                    self._pieces.append(text)
            for call in delta.get("tool_calls") or ():
                function = call.get("function") or {}
                self._pieces.extend(filter(None, (function.get("name"), function.get("arguments"))))
            if choice.get("finish_reason") and self.finish_reason is None:
                self.finish_reason = choice["finish_reason"]

    def final_usage(self) -> Usage:
        """Return the usage to bill: the upstream's at the end, else what was delivered.

        A stream that ended early is billed its delivered text, counted here, with the
        upstream's own prompt count when it sent one before the end (Anthropic does, at
        message_start), else the hold's estimate. Nothing delivered, nothing billed.
        """
        if self.complete and self.usage is not None:
            return self.usage
        route = self.generation.model.routes[0]
        # Each delta is counted alone: joined, neighbouring pieces could merge into fewer
        # tokens than were generated.
        delivered = sum(route.adapter.count_text_tokens(p, route.target) for p in self._pieces)
        if delivered == 0:
            return Usage()
        if self.usage is not None:
            completion = max(self.usage.completion_tokens, delivered)
            return replace(self.usage, completion_tokens=completion, estimated=True)
        return Usage(
            prompt_tokens=self.generation.prompt_tokens,
            completion_tokens=delivered,
            estimated=True,
        )


def finish_generation(
    generation: Generation, *, usage: Usage, status: str, finish_reason: str | None
) -> Decimal:
    """Charge the actual cost and write the generation record, once; return the charge."""
    if usage.total_tokens == 0:
        usage = Usage()
    charged = settle_hold(
        generation.hold,
        cost=cost_of(usage, generation.model.pricing),
        generation_id=generation.id,
        records=lambda charge: (
            generation_record(generation, usage, charge, status, finish_reason),
            *key_use_records(generation.caller),
        ),
    )
    generation.settled = True
    return charged


def generation_record(
    generation: Generation, usage: Usage, cost: Decimal, status: str, finish_reason: str | None
) -> BoundStatement:
    """Return the INSERT of the generation's record, with its values."""
    pricing = generation.model.pricing
    return _INSERT_GENERATION, {
        "id": generation.id,
        "account_id": generation.caller.account_id,
        "api_key_id": generation.caller.key_id,
        "model": generation.model.id,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "prompt_image_tokens": usage.prompt_image_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "cost": cost,
        "price_prompt": pricing.prompt,
        "price_completion": pricing.completion,
        "price_cached_read": pricing.cached_read,
        "price_image": pricing.image,
        "status": status,
        "finish_reason": finish_reason,
        "streamed": generation.request.stream,
        "estimated": usage.estimated,
        "latency_ms": int((time.monotonic() - generation.started) * 1000),
        "created_at": utcnow(),
    }


def usage_body(usage: Usage, cost: Decimal) -> dict[str, Any]:
    """Render the contract's Usage, with the cost charged."""
    body = usage.to_dict()
    body["cost"] = {"total_cost": cost}
    return body


def completion_body(
    generation: Generation, completion: Completion, cost: Decimal
) -> dict[str, Any]:
    """Build the ChatCompletionResponse."""
    return {
        "id": generation.id,
        "object": "chat.completion",
        "created": generation.created,
        "model": generation.model.id,
        "choices": completion.choices,
        "usage": usage_body(completion.usage, cost),
        "system_fingerprint": completion.system_fingerprint,
    }


def chunk_body(
    generation: Generation, choices: list[dict[str, Any]], system_fingerprint: str | None = None
) -> dict[str, Any]:
    """Build a ChatCompletionChunk carrying ``choices``."""
    return {
        "id": generation.id,
        "object": "chat.completion.chunk",
        "created": generation.created,
        "model": generation.model.id,
        "system_fingerprint": system_fingerprint,
        "choices": choices,
    }


def usage_chunk_body(generation: Generation, usage: Usage, cost: Decimal) -> dict[str, Any]:
    """Build the final chunk of a stream whose caller asked for usage."""
    body = chunk_body(generation, [])
    body["usage"] = usage_body(usage, cost)
    return body
