"""A generation's life: hold its worst case, run it on the model's routes, settle it once.

Streamed and whole answers end in the same ``finish_generation``, which charges the
actual cost and writes the generation record in one transaction, so a caller that
disconnects mid-stream is still billed exactly once, for what was produced.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import insert

from app.auth.keys import Caller
from app.catalog.pricing import (
    NO_SURCHARGES,
    ONE,
    Pricing,
    Surcharges,
    cost_of,
    worst_case_cost,
)
from app.catalog.registry import Model
from app.credits.balances import BudgetShortfall, HeldCredit, Shortfall
from app.credits.expiry import record_first_progress
from app.credits.holds import place_hold
from app.credits.settlement import Rollup, hour_of, settle_hold
from app.database import BoundStatement, utcnow
from app.generations.live import live_holds
from app.generations.metering import DeliveryMeter, Meter, Outcome, RelayMeter, StreamMeter
from app.generations.models import CANCELLED, CHAT, COMPLETED, FAILED, INTERRUPTED
from app.generations.models import Generation as GenerationRecord
from app.generations.prompts import EmbeddingInputs, Prompt, TranslatedPrompt
from app.generations.refusals import (
    check_surcharges,
    fit_request_to_model,
    insufficient_credits,
    prompt_tokens_within_context,
)
from app.observability.trace import RequestTrace, current_trace
from app.providers.base import (
    ChatRequest,
    Chunk,
    Completion,
    EmbeddingRequest,
    Embeddings,
    NativeAnswer,
    NativeCall,
    Route,
    Usage,
)
from app.providers.errors import UpstreamError
from app.providers.router import (
    complete_on_routes,
    embed_on_routes,
    relay_on_routes,
    relay_stream_on_routes,
    stream_on_routes,
)

# The statement that records a generation, which its settlement carries (see
# generation_record). Built once: a statement costs more CPU to construct than to execute.
INSERT_GENERATION = insert(GenerationRecord.__table__)


@dataclass
class Generation:
    """A request in flight: who pays, what runs, and the credit held for it.

    Its hold is renewed by the worker's sweeper (``live_holds``) for as long as this
    object lives and the generation has not settled.
    """

    id: str
    caller: Caller
    model: Model
    request: ChatRequest
    hold: HeldCredit
    prompt_tokens: int
    # Whether prompt_tokens is the prompt's count, or only the upper bound the hold used.
    prompt_tokens_exact: bool = True
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    settled: bool = False
    # The request's trace: its id, the upstream calls and the first token's time.
    trace: RequestTrace = field(default_factory=current_trace)
    # While it streams: what it delivered, which the worker records as its progress.
    meter: Meter | None = None
    # Whether its progress was recorded before its stream's first output went out.
    progress_recorded: bool = False
    # The front door it came in by (generations.models: CHAT, RESPONSES, MESSAGES, ...).
    api: str = CHAT
    # What it asked for that is billed beyond tokens: a service tier, hosted tools.
    surcharges: Surcharges = NO_SURCHARGES


def start_generation(
    *,
    caller: Caller,
    model: Model,
    request: ChatRequest,
    hold_ttl_seconds: int,
    generation_id: str | None = None,
    api: str = CHAT,
    surcharges: Surcharges = NO_SURCHARGES,
    prompt: Prompt | None = None,
    context_checked: bool = False,
) -> Generation:
    """Fit the request to the model and hold its worst-case cost, under the generation's id.

    ``surcharges`` is what the request asks for that is billed beyond its tokens (its
    service tier, its hosted tools): each must be priced, and the hold covers it.

    ``generation_id`` is given when it was chosen before (an Idempotency-Key's claim
    names the generation it runs); otherwise a new one is made. ``prompt`` is what is
    sent, when it is not ``request``'s messages (a body passed through, the inputs of an
    embeddings request). ``context_checked`` says the door checked the prompt against
    the context length itself (an embeddings request's inputs, each alone): the whole
    prompt may then be longer.

    The hold is sized with a cheap upper bound of the prompt's tokens (its UTF-8 size);
    the prompt is tokenized only when that bound is too tight, for the context length or
    for the balance (or key allowance), and then the exact count decides: a request that
    fits is never refused.

    :raise UnsupportedContent, ContextLengthExceeded, OutputLimitExceeded: 400.
    :raise UnpricedSurcharge: a tier or hosted tool the catalog does not price (400).
    :raise InsufficientCredits: the available balance cannot cover the worst case.
    :raise KeyRevoked, InvalidKey: the key changed since its caller was found (place_hold).
    """
    request = fit_request_to_model(request, model)
    if surcharges is not NO_SURCHARGES:
        check_surcharges(surcharges, model)
    prompt = prompt or TranslatedPrompt(request, model.routes[0])
    prompt_tokens, exact = prompt.bound(), False
    if prompt_tokens > model.context_length and not context_checked:
        prompt_tokens, exact = prompt_tokens_within_context(prompt, model), True
    generation_id = generation_id or new_generation_id()
    hold = HoldTerms(caller, generation_id, hold_ttl_seconds, surcharges)
    held = _hold_worst_case(hold, model, request, prompt_tokens)
    if isinstance(held, Shortfall | BudgetShortfall) and not exact:
        prompt_tokens, exact = prompt.count(), True
        held = _hold_worst_case(hold, model, request, prompt_tokens)
    if isinstance(held, Shortfall | BudgetShortfall):
        raise insufficient_credits(
            held, model=model, request=request, prompt_tokens=prompt_tokens, surcharges=surcharges
        )
    generation = Generation(
        id=generation_id,
        caller=caller,
        model=model,
        request=request,
        hold=held,
        prompt_tokens=prompt_tokens,
        prompt_tokens_exact=exact,
        api=api,
        surcharges=surcharges,
    )
    live_holds.track(held.id, generation)
    return generation


def count_prompt_tokens(*, model: Model, prompt: Prompt) -> int:
    """Count the prompt's tokens as a hold on ``model`` would; nothing is held or charged.

    Counting stops once the count passes the model's context length (such a prompt cannot
    run): the number returned is then above it, not exact.
    """
    return prompt.count(limit=model.context_length)


@dataclass(frozen=True)
class HoldTerms:
    """Who a generation's hold is placed for, under which id, and for how long."""

    caller: Caller
    hold_id: str
    ttl_seconds: int
    surcharges: Surcharges = NO_SURCHARGES


def new_generation_id() -> str:
    """Return a fresh generation id, as Chat Completions names its answers."""
    return "chatcmpl-" + secrets.token_hex(12)


def new_embedding_id() -> str:
    """Return a fresh id for an embeddings request's generation record and hold."""
    return "embd-" + secrets.token_hex(12)


def _hold_worst_case(
    terms: HoldTerms, model: Model, request: ChatRequest, prompt_tokens: int
) -> HeldCredit | Shortfall | BudgetShortfall:
    completion_tokens = (request.max_output_tokens or model.max_output_tokens) * (
        request.choice_count
    )
    worst = worst_case_cost(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        pricing=model.pricing,
        surcharges=terms.surcharges,
    )
    return place_hold(
        account_id=terms.caller.account_id,
        amount=worst,
        ttl_seconds=terms.ttl_seconds,
        # A hold reserves on its key and member where they have budgets; every charge is
        # counted on both, so that a budget put on either later starts from the window's spend.
        key_id=terms.caller.key_id,
        key_digest=terms.caller.key_digest,
        hold_id=terms.hold_id,
    )


@dataclass(frozen=True)
class Answer:
    """A whole generation's result: the completion, and what was charged for it."""

    completion: Completion
    cost: Decimal


@dataclass(frozen=True)
class StreamEnd:
    """The last item of a stream that ran to its end: its usage and what was charged."""

    usage: Usage
    cost: Decimal
    finish_reason: str | None


StreamItem = Chunk | StreamEnd | None


def run_generation(generation: Generation) -> Answer:
    """Run the generation to the end, settle it, and return its answer."""
    try:
        completion = complete_on_routes(
            generation.model.routes, generation.request, generation.trace
        )
    except BaseException:
        finish_generation(generation, usage=Usage(), status=FAILED, finish_reason=None)
        raise
    finish_reason = completion.choices[0].get("finish_reason") if completion.choices else None
    cost = finish_generation(
        generation, usage=completion.usage, status=COMPLETED, finish_reason=finish_reason
    )
    return Answer(completion, cost)


def start_embeddings(
    caller: Caller,
    model: Model,
    request: EmbeddingRequest,
    *,
    api: str,
    hold_ttl_seconds: int,
    generation_id: str,
) -> Generation:
    """Hold for ``request``'s inputs, counted by the model's first route, and start its record.

    Nothing is generated: the hold is the inputs' tokens (completion is priced 0). The
    door has checked the dimensions and each input's context first.
    """
    return start_generation(
        caller=caller,
        model=model,
        request=ChatRequest(model=model.id, messages=[]),
        hold_ttl_seconds=hold_ttl_seconds,
        generation_id=generation_id,
        api=api,
        prompt=EmbeddingInputs(request, model.routes[0]),
        context_checked=True,
    )


def run_embeddings(generation: Generation, request: EmbeddingRequest) -> tuple[Embeddings, Decimal]:
    """Embed ``request``'s inputs on the model's routes, settle at the upstream's usage.

    Return the vectors and what was charged.
    """
    try:
        embeddings = embed_on_routes(generation.model.routes, request, generation.trace)
    except BaseException:
        finish_generation(generation, usage=Usage(), status=FAILED, finish_reason=None)
        raise
    cost = finish_generation(
        generation, usage=embeddings.usage, status=COMPLETED, finish_reason=None
    )
    return embeddings, cost


def stream_generation(generation: Generation) -> Iterator[StreamItem]:
    """Yield the generation's chunks that carry choices, then its StreamEnd; settle once.

    A None says that what follows may wait (for the upstream, or the settlement): the
    chunks before it go out now. Chunks between two Nones came in one upstream read. A
    stream that does not reach its end (the upstream failed, the caller went away) is
    settled for what it delivered when it is closed.
    """
    meter = generation.meter = StreamMeter(generation)
    status = FAILED
    trace = generation.trace
    chunks = stream_on_routes(generation.model.routes, generation.request, trace)
    try:
        for chunk in chunks:
            if chunk.usage is not None:
                meter.usage = chunk.usage
            if chunk.choices:
                if not generation.progress_recorded:
                    trace.note_first_token()
                    record_progress_before_output(generation)
                meter.observe(chunk)
                yield chunk
            if not chunk.more:
                yield None
        # The settlement writes to the database: what the upstream sent goes out first.
        yield None
        status = COMPLETED
        yield _end_stream(generation, meter)
    except GeneratorExit:
        # The server closes the generator when the caller has gone away.
        status = CANCELLED
        raise
    finally:
        _close_stream(generation, meter, chunks, status)


def native_routes(model: Model, api: str) -> tuple[Route, ...]:
    """Return the model's routes that pass ``api`` through natively, when its first does.

    A request passed through is tried only on such routes: a door answers either in the
    upstream's own bytes or from normalized results, never both for one request.
    """
    if not model.routes[0].speaks(api):
        return ()
    return tuple(route for route in model.routes if route.speaks(api))


def relay_generation(
    generation: Generation, call: NativeCall, outcome_of: Callable[[dict[str, Any]], Outcome]
) -> tuple[NativeAnswer, Usage, Decimal]:
    """Pass ``call`` through whole on the model's native routes; settle; return what came.

    ``outcome_of`` reads the upstream's answer in its door's wire format: its usage, how
    it finished, whether it failed.

    :raise UpstreamError: the upstream failed, or answered something that is not JSON;
        the latter is settled at once, at an estimate (``settle_unreadable``).
    """
    routes = native_routes(generation.model, call.api)
    try:
        answer = relay_on_routes(routes, call, generation.trace)
    except BaseException:
        finish_generation(generation, usage=Usage(), status=FAILED, finish_reason=None)
        raise
    if answer.decoded is None:
        settle_unreadable(generation, answer.body)
        raise UpstreamError("The model's upstream answered something the gateway cannot read.")
    outcome = outcome_of(answer.decoded)
    cost = finish_generation(
        generation,
        usage=outcome.usage,
        status=FAILED if outcome.failed else COMPLETED,
        finish_reason=outcome.finish_reason,
    )
    return answer, outcome.usage, cost


def settle_unreadable(generation: Generation, body: bytes) -> None:
    """Settle an answer the upstream sent but that cannot be read, as a failure, at once.

    Its usage is estimated, never below what the upstream may have billed: the whole
    prompt, counted as for the hold, and the answer's body counted as generated text.
    """
    meter = DeliveryMeter(generation)
    meter.deliver(body.decode("utf-8", "replace"))
    finish_generation(generation, usage=meter.answer_usage(), status=FAILED, finish_reason=None)


def relay_stream(generation: Generation, call: NativeCall, meter: RelayMeter) -> Iterator[Any]:
    """Yield the upstream's bytes of ``call`` passed through, then a StreamEnd; settle once.

    ``meter`` reads the bytes as its door's wire format: what was delivered, the usage the
    upstream reported. Each upstream read is one item, followed by a flush point (None).
    """
    generation.meter = meter
    status = FAILED
    reads = relay_stream_on_routes(
        native_routes(generation.model, call.api), call, generation.trace
    )
    try:
        for data in reads:
            if meter.observe(data):
                generation.trace.note_first_token()
            if not generation.progress_recorded:
                record_progress_before_output(generation)
            yield data
            yield None
        status = COMPLETED
        yield _end_stream(generation, meter)
    except GeneratorExit:
        status = CANCELLED
        raise
    finally:
        _close_stream(generation, meter, reads, status)


def record_progress_before_output(generation: Generation) -> None:
    """Record the stream's progress before its first output goes out, once.

    The worker records its streams' progress about once a second; a worker killed in a
    stream's first second would otherwise leave a hold with none, released unbilled
    although output went out. Recorded here, the hold is settled if the worker dies
    (``settle_interrupted``).
    """
    generation.progress_recorded = True
    record_first_progress(generation.hold.id, progress_of(generation, always=True))


def _end_stream(generation: Generation, meter: Meter) -> StreamEnd:
    """Settle a stream that reached its end, at the upstream's usage; return its end."""
    meter.complete = True
    usage = meter.final_usage()
    status = FAILED if meter.failed else COMPLETED
    cost = finish_generation(
        generation, usage=usage, status=status, finish_reason=meter.finish_reason
    )
    return StreamEnd(usage, cost, meter.finish_reason)


def _close_stream(generation: Generation, meter: Meter, items: Iterator[Any], status: str) -> None:
    """Close the upstream, then settle what the stream delivered if it has not settled."""
    # The upstream first: a caller who left must not keep it generating while the
    # settlement is written.
    items.close()
    if not generation.settled:
        finish_generation(
            generation, usage=meter.final_usage(), status=status, finish_reason=meter.finish_reason
        )


def finish_generation(
    generation: Generation, *, usage: Usage, status: str, finish_reason: str | None
) -> Decimal:
    """Charge the actual cost and write the generation record, once; return the charge."""
    if usage.total_tokens == 0 and not usage.tool_calls:
        usage = Usage()
    record = generation_record(generation, usage, status, finish_reason)
    cost = cost_of(usage, generation.model.pricing, record[1]["tier_multiplier"])
    charged = settle_hold(
        generation.hold,
        cost=cost,
        generation_id=generation.id,
        record=record,
        rollup=rollup_of(record[1]),
    )
    generation.settled = True
    live_holds.forget(generation.hold.id)
    generation.trace.note_generation(
        generation_id=generation.id,
        model=generation.model.id,
        api=generation.api,
        usage=usage,
        cost=charged,
        status=status,
    )
    return charged


def generation_record(
    generation: Generation, usage: Usage, status: str, finish_reason: str | None
) -> BoundStatement:
    """Return the INSERT of the generation's record; the ledger fills in its cost."""
    pricing = generation.model.pricing
    tier, multiplier = None, ONE
    if usage.service_tier is not None or generation.surcharges.tier is not None:
        tier, multiplier = priced_tier(usage.service_tier, generation.surcharges.tier, pricing)
    return INSERT_GENERATION, {
        "id": generation.id,
        "account_id": generation.caller.account_id,
        "api_key_id": generation.caller.key_id,
        "model": generation.model.id,
        "api": generation.api,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "prompt_image_tokens": usage.prompt_image_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "tool_calls": priced_calls(usage.tool_calls, pricing) if usage.tool_calls else None,
        "service_tier": tier,
        "tier_multiplier": multiplier,
        "price_prompt": pricing.prompt,
        "price_completion": pricing.completion,
        "price_cached_read": pricing.cached_read,
        "price_image": pricing.image,
        "price_cache_write": pricing.cache_write,
        "price_cache_write_1h": pricing.cache_write_1h,
        "status": status,
        "finish_reason": finish_reason,
        "streamed": generation.request.stream,
        "estimated": usage.estimated,
        "latency_ms": int((time.monotonic() - generation.started) * 1000),
        "created_at": utcnow(),
        "request_id": generation.trace.request_id,
        "time_to_first_token_ms": _milliseconds(generation.trace.first_token_seconds),
        "upstream_attempts": generation.trace.attempts_as_dicts(),
    }


# The record's fields a stream's progress keeps as text: JSON has no Decimal or datetime.
_PRICES = (
    "price_prompt",
    "price_completion",
    "price_cached_read",
    "price_image",
    "price_cache_write",
    "price_cache_write_1h",
    "tier_multiplier",
)


def priced_tier(
    reported: str | None, requested: str | None, pricing: Pricing
) -> tuple[str | None, Decimal]:
    """Return the tier a generation is priced in, and its multiplier of every price.

    The tier the upstream says it served in, when it says one the catalog prices; else
    the one the request asked for (which the catalog prices: it was checked before).
    """
    if reported is None and requested is None:
        return None, ONE
    for tier in (reported, requested):
        if tier is not None and (multiplier := pricing.tier_multiplier(tier)) is not None:
            return tier, multiplier
    return None, ONE


def priced_calls(calls: Mapping[str, int], pricing: Pricing) -> dict[str, dict[str, Any]]:
    """Return the hosted tools' calls with each tool's price per call, as the record keeps them.

    A tool the catalog does not price was not asked for (it is refused): its calls, if an
    upstream reports some, are recorded at 0.
    """
    prices = pricing.tool_calls
    return {
        tool: {"calls": count, "price": str(prices.get(tool, 0))}
        for tool, count in sorted(calls.items())
        if count
    }


def progress_of(generation: Generation, *, always: bool = False) -> dict[str, Any] | None:
    """Return the record of what the streaming ``generation`` delivered so far, as JSON.

    None when nothing was delivered, and no usage came, since its progress was last
    taken (unless ``always``). Kept with its hold (``expiry.record_progress``), it is what
    the hold is settled at if the worker dies before the stream ends
    (``settle_interrupted``): the upstream's usage too, once it came. It also says whether
    the upstream had ended the generation, and the most the request could use (its
    ``limits``) for when it had not.
    """
    meter = generation.meter
    if meter is None or generation.settled or not (always or meter.changed_since_counted):
        return None
    usage = meter.usage_so_far()
    if meter.usage is not None and not usage.total_tokens:
        # Nothing delivered yet, but the upstream counted the prompt it read.
        usage = replace(meter.usage, estimated=True)
    _, record = generation_record(generation, usage, INTERRUPTED, None)
    for name in ("id", "account_id", "api_key_id"):
        del record[name]
    for name in _PRICES:
        record[name] = str(record[name])
    record["created_at"] = record["created_at"].isoformat()
    record["ended"] = meter.ended
    record["limits"] = _limits_of(generation)
    return record


def _limits_of(generation: Generation) -> dict[str, Any]:
    """Return the most ``generation`` can use: its hold's prompt count, output and calls."""
    request, model = generation.request, generation.model
    calls = generation.surcharges.tool_calls
    return {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": (request.max_output_tokens or model.max_output_tokens)
        * request.choice_count,
        "tool_calls": priced_calls(calls, model.pricing) if calls else None,
    }


def at_most_it_could_use(record: dict[str, Any], limits: Mapping[str, Any]) -> None:
    """Raise a dead worker's stream's recorded usage to the most its request could use.

    What went out after its progress was last recorded is unknown: its output may have
    reached the request's limit, its hosted tools the calls its hold covered. The prompt
    is the upstream's count where it reported one, else the hold's.
    """
    record["prompt_tokens"] = record["prompt_tokens"] or limits["prompt_tokens"]
    record["completion_tokens"] = max(record["completion_tokens"], limits["completion_tokens"])
    calls = dict(record.get("tool_calls") or {})
    for tool, line in (limits.get("tool_calls") or {}).items():
        if line["calls"] > calls.get(tool, {}).get("calls", 0):
            calls[tool] = line
    record["tool_calls"] = calls or None
    record["estimated"] = True


def settle_interrupted(hold: HeldCredit, progress: dict[str, Any]) -> Decimal:
    """Settle the hold of a stream whose worker died, from its last recorded progress.

    At that progress once the upstream had ended the generation: nothing more can have
    gone out. Before that, what went out since the progress was recorded died with the
    worker, and no smaller figure can be proven: the usage is raised to the most the
    request could use (``at_most_it_could_use``), so that a charge never counts less
    than was delivered. The record says the generation was interrupted, its usage
    estimated.
    """
    # Progress recorded before 1-hour cache writes and tiers were priced names neither.
    earlier = {"price_cache_write_1h": progress["price_cache_write"], "tier_multiplier": "1"}
    record = {**earlier, **progress, "created_at": datetime.fromisoformat(progress["created_at"])}
    # Progress recorded before limits were kept says neither; it is settled as it says.
    ended, limits = record.pop("ended", True), record.pop("limits", None)
    if limits is not None and not ended:
        at_most_it_could_use(record, limits)
    record.update({name: Decimal(record[name]) for name in _PRICES})
    record.update(id=hold.id, account_id=hold.account_id, api_key_id=hold.key_id)
    usage, pricing = recorded_usage(record)
    return settle_hold(
        hold,
        cost=cost_of(usage, pricing, record["tier_multiplier"]),
        generation_id=hold.id,
        record=(INSERT_GENERATION, record),
        rollup=rollup_of(record),
    )


def recorded_usage(record: Mapping[str, Any]) -> tuple[Usage, Pricing]:
    """Return the usage and prices a generation's record (or its row) says it was charged."""
    calls = record.get("tool_calls") or {}
    usage = Usage(
        prompt_tokens=record["prompt_tokens"],
        completion_tokens=record["completion_tokens"],
        cached_tokens=record["cached_tokens"],
        prompt_image_tokens=record["prompt_image_tokens"],
        cache_write_tokens=record["cache_write_tokens"],
        cache_write_1h_tokens=record.get("cache_write_1h_tokens") or 0,
        tool_calls={tool: line["calls"] for tool, line in calls.items()},
    )
    pricing = Pricing(
        prompt=record["price_prompt"],
        completion=record["price_completion"],
        cached_read=record["price_cached_read"],
        image=record["price_image"],
        cache_write=record["price_cache_write"],
        cache_write_1h=record["price_cache_write_1h"],
        tool_calls={tool: Decimal(line["price"]) for tool, line in calls.items()},
    )
    return usage, pricing


def rollup_of(row: dict[str, Any]) -> Rollup:
    """Return where a generation's record is totalled: its model, its hour, its tokens."""
    return Rollup(
        model=row["model"],
        hour=hour_of(row["created_at"]),
        prompt_tokens=row["prompt_tokens"],
        cached_tokens=row["cached_tokens"],
        completion_tokens=row["completion_tokens"],
        reasoning_tokens=row["reasoning_tokens"],
    )


def _milliseconds(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)
