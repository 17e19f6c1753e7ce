"""A Responses request passed through to an upstream that serves /v1/responses itself.

The gateway keeps owning the conversation on every route, so that retrieval, chaining
and failover work whichever route answered: the upstream is sent the whole conversation
(the stored chain's items, then the request's) with ``store: false`` and no
``previous_response_id``, and its answer is stored and answered under the gateway's
``resp_`` id. Everything else the caller sent goes on as sent: hosted tools, namespaces,
``include``, ``reasoning``, fields the gateway does not know; reasoning items come back
unchanged, ``encrypted_content`` included. Two things change on the way: item ids the
gateway made for its own listing are not sent (the upstream never saw them), nor are
reasoning items without ``encrypted_content`` (an upstream that keeps nothing cannot
read them back); and ``max_output_tokens`` is the hold's when the caller set none. The
conversation is not translated: the hold counts the forwarded body (SENT_BODY,
app.generations.prompts), every item and part of it.

The answer is the upstream's, with the gateway's id, the model's public id, the
request's ``store`` and ``previous_response_id``, and ``usage.cost``. A stream's events
go out as each upstream read completes them; its last event (``response.completed``,
``.incomplete`` or ``.failed``) waits for the settlement, whose cost it carries. An
upstream's ``error`` event, and whatever follows it, waits too: a caller who sees the
stream end sees it billed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from typing import Any

from app.catalog.pricing import NO_SURCHARGES, Surcharges, calls_held
from app.encoding import dumps_transient
from app.errors import APIError
from app.generations.lifecycle import Generation, StreamEnd
from app.generations.metering import DeliveryMeter, Metered, Outcome
from app.generations.models import RESPONSES
from app.generations.prompts import BodyShape, image, opaque
from app.providers.base import ChatRequest, NativeCall, Usage
from app.providers.errors import UpstreamError
from app.providers.event_stream import EventBuilder, json_object
from app.responses.bodies import COMPLETED, FAILED, INCOMPLETE, error_body, usage_body
from app.responses.conversation import Turn
from app.responses.ids import response_id_of_item
from app.responses.schemas import ResponseRequest, item_type
from app.sse import Framing, typed_event, typed_events, written_event

# The fields of a request the gateway answers itself, not the upstream.
GATEWAY_FIELDS = ("previous_response_id", "store", "input", "max_output_tokens")
# The events whose delta is generated text: what a cut-off stream delivered.
TEXT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
# Output items that call a tool: a response that ends with one ends for its result.
CALL_ITEMS = frozenset({"function_call", "custom_tool_call"})
# Hosted tools billed per call, by their type without its version (``_2025_08_26``) and
# preview mark, and the priced tool each is.
HOSTED_TOOLS = {
    "web_search": "web_search",
    "file_search": "file_search",
    "code_interpreter": "code_interpreter",
    "image_generation": "image_generation",
    "mcp": "mcp",
}
TOOL_VERSION = re.compile(r"(_preview)?(_\d{4}_\d{2}_\d{2})?$")
# Output items that are a hosted tool's call, billed per call: the priced tool of each.
HOSTED_CALL_ITEMS = {
    "web_search_call": "web_search",
    "file_search_call": "file_search",
    "code_interpreter_call": "code_interpreter",
    "image_generation_call": "image_generation",
    "mcp_call": "mcp",
}


def surcharges_of(body: dict[str, Any], *, passed_through: bool) -> Surcharges:
    """Return what a Responses request asks for that is billed beyond tokens.

    When it is passed through (a translated route is sent neither): its ``service_tier``,
    and each hosted tool it offers, held at its ``max_tool_calls`` (which bounds all of
    its hosted calls together), else the default.
    """
    if not passed_through:
        return NO_SURCHARGES
    tier = body.get("service_tier")
    calls: dict[str, int] = {}
    for tool in body.get("tools") if type(body.get("tools")) is list else ():
        kind = tool.get("type") if type(tool) is dict else None
        priced = HOSTED_TOOLS.get(TOOL_VERSION.sub("", kind)) if type(kind) is str else None
        if priced is not None:
            calls[priced] = calls_held(body.get("max_tool_calls"))
    if not calls and type(tier) is not str:
        return NO_SURCHARGES
    return Surcharges(tier=tier if type(tier) is str else None, tool_calls=calls)


# What a Responses body passed through shows the model (app.generations.prompts): all of
# it but these settings; images (an input's, a screenshot, a code interpreter's or image
# generation's), files and recordings by their rules, in whatever item they are.
SENT_BODY = BodyShape(
    settings=frozenset(
        {
            "model",
            "stream",
            "store",
            "max_output_tokens",
            "temperature",
            "top_p",
            "top_logprobs",
            "reasoning",
            "include",
            "metadata",
            "user",
            "safety_identifier",
            "prompt_cache_key",
            "prompt_cache_retention",
            "truncation",
            "service_tier",
            "parallel_tool_calls",
            "tool_choice",
            "verbosity",
            "stream_options",
            "max_tool_calls",
            "client_metadata",
        }
    ),
    media={
        "input_image": image,
        "computer_screenshot": image,
        "image": image,
        "image_generation_call": image,
        "input_file": opaque,
        "input_audio": opaque,
    },
    # The schemas of function tools and of the output: JSON the model reads.
    free_form=frozenset({"parameters", "schema"}),
)


def sent_items(body: dict[str, Any], request: ResponseRequest) -> list[dict[str, Any]]:
    """Return the request's items as the caller sent them (a string input as its message)."""
    sent = body.get("input")
    return sent if type(sent) is list else request.input


def forwarded_body(turn: Turn, body: dict[str, Any]) -> dict[str, Any]:
    """Return what the upstream is sent but its output cap: the body, the whole conversation.

    It is counted for the hold (SENT_BODY) before the cap is set (``native_call``).
    """
    forwarded = {key: value for key, value in body.items() if key not in GATEWAY_FIELDS}
    forwarded["input"] = forwarded_items(turn)
    forwarded["store"] = False
    return forwarded


def native_call(turn: Turn, forwarded: dict[str, Any], generation: Generation) -> NativeCall:
    """Return the request to pass through: the forwarded body, capped at what is held."""
    # The hold covers this many output tokens: the upstream may not generate more.
    capped = generation.request.max_output_tokens or generation.model.max_output_tokens
    body = {**forwarded, "max_output_tokens": capped}
    return NativeCall(api=RESPONSES, body=body, stream=turn.request.stream)


def passed_request(request: ResponseRequest) -> ChatRequest:
    """Return the normalized request of one passed through: its output cap, no messages.

    The upstream reads the forwarded body, which the hold counts (SENT_BODY): translating
    the conversation would only refuse what the upstream accepts.
    """
    params = {}
    if "max_output_tokens" in request.params:
        params["max_tokens"] = request.params["max_output_tokens"]
    return ChatRequest(model=request.model, messages=[], params=params, stream=request.stream)


def forwarded_items(turn: Turn) -> list[dict[str, Any]]:
    """Return the conversation's items as the upstream is sent them (see the module)."""
    named_here = turn.chain.response_ids | {turn.draft.id}
    items = []
    for item in turn.chain.items + turn.items:
        if item_type(item) == "reasoning" and not item.get("encrypted_content"):
            continue
        item_id = item.get("id")
        if type(item_id) is str and response_id_of_item(item_id) in named_here:
            item = {key: value for key, value in item.items() if key != "id"}
        items.append(item)
    return items


def reported_usage(response: dict[str, Any]) -> Usage | None:
    """Return the usage a Responses object reports, or None when it reports none.

    Its hosted tools' calls are its output items of their types; its tier the one it names.
    """
    usage = response.get("usage")
    if type(usage) is not dict:
        return None
    details = usage.get("input_tokens_details") or {}
    output_details = usage.get("output_tokens_details") or {}
    return Usage(
        prompt_tokens=_count(usage.get("input_tokens")),
        cached_tokens=_count(details.get("cached_tokens")),
        completion_tokens=_count(usage.get("output_tokens")),
        reasoning_tokens=_count(output_details.get("reasoning_tokens")),
        tool_calls=hosted_calls(response.get("output")),
        service_tier=tier if type(tier := response.get("service_tier")) is str else None,
    )


def hosted_calls(output: Any) -> dict[str, int] | None:
    """Count the hosted tools' calls among a response's output items, by priced tool."""
    calls: dict[str, int] = {}
    for item in output if type(output) is list else ():
        tool = HOSTED_CALL_ITEMS.get(item.get("type")) if type(item) is dict else None
        if tool is not None:
            calls[tool] = calls.get(tool, 0) + 1
    return calls or None


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def whole_outcome(generation: Metered) -> Callable[[dict[str, Any]], Outcome]:
    """Return how a whole answer is read: its usage, how it finished, whether it failed.

    The usage is the upstream's, else an estimate (``DeliveryMeter.answer_usage``): the prompt as
    its hold counted it, what its output comes to.
    """

    def outcome_of(response: dict[str, Any]) -> Outcome:
        usage = reported_usage(response)
        if usage is None:
            meter = DeliveryMeter(generation)
            for text in output_texts(response.get("output")):
                meter.deliver(text)
            usage = meter.answer_usage()
        failed = response.get("status") == FAILED
        return Outcome(usage, finish_reason_of(response), failed)

    return outcome_of


def finish_reason_of(response: dict[str, Any]) -> str | None:
    """Return why a response ended, in the words of the generation records (chat's)."""
    status = response.get("status")
    if status == INCOMPLETE:
        details = response.get("incomplete_details")
        reason = details.get("reason") if type(details) is dict else None
        return "content_filter" if reason == "content_filter" else "length"
    if status != COMPLETED:
        return None
    output = response.get("output")
    calls = any(type(item) is dict and item.get("type") in CALL_ITEMS for item in output or ())
    return "tool_calls" if calls else "stop"


def output_texts(output: Any) -> Iterator[str]:
    """Yield the generated text of output items: text, refusals, reasoning, arguments."""
    for item in output if type(output) is list else ():
        if type(item) is not dict:
            continue
        if type(item.get("arguments")) is str:
            yield item["arguments"]
        for key in ("content", "summary"):
            for part in item.get(key) or ():
                if type(part) is dict and type(part.get("text") or part.get("refusal")) is str:
                    yield part.get("text") or part.get("refusal")


def as_answered(
    turn: Turn, response: dict[str, Any], charged: tuple[Usage, Decimal] | None = None
) -> dict[str, Any]:
    """Return the upstream's Response object as the gateway answers it (see the module).

    ``charged`` is the usage billed and its cost, once settled: the upstream's usage gets
    the cost, or, when it reported none, the usage billed is shown.
    """
    answered = {
        **response,
        "id": turn.draft.id,
        "model": turn.request.model,
        "previous_response_id": turn.request.params.get("previous_response_id"),
        "store": turn.request.store,
    }
    if charged is not None:
        usage, cost = charged
        reported = response.get("usage")
        if type(reported) is dict:
            answered["usage"] = {**reported, "cost": {"total_cost": cost}}
        else:
            answered["usage"] = usage_body(usage, cost)
    return answered


def answered_whole(
    turn: Turn, response: dict[str, Any], usage: Usage, cost: Decimal
) -> dict[str, Any]:
    """Return a whole answer as the gateway answers it, stored if the request asked."""
    answered = as_answered(turn, response, (usage, cost))
    if answered.get("status") in (COMPLETED, INCOMPLETE):
        turn.finished(answered)
    return answered


class RelayedStream(DeliveryMeter):
    """Reads a passed-through stream's events as they come: its meter, and its writer.

    ``observe`` takes each upstream read (the core's RelayMeter); ``events`` then frames
    the events it completed, each response object answered as the gateway's. The last
    event is kept back until ``ending`` is given the stream's cost, and so are an
    ``error`` event and the events after it.
    """

    def __init__(self, turn: Turn, generation: Generation) -> None:
        super().__init__(generation)
        self.turn = turn
        self.builder = EventBuilder()
        # The events the last reads completed: name, data as sent, data decoded.
        self.completed: list[tuple[str, str, dict[str, Any]]] = []
        # The upstream's error event and those after it, kept back for the end.
        self.kept_back: list[tuple[str, str, dict[str, Any]]] = []
        self.terminal: dict[str, Any] | None = None
        self.sequence = -1
        # The response as last announced, for a stream that breaks to end with.
        self.snapshot: dict[str, Any] | None = None
        # Hosted tools' calls as their items came: billed if the stream breaks before its
        # last event, whose response counts them otherwise.
        self.calls: dict[str, int] = {}

    def observe(self, data: bytes) -> bool:
        """Read one upstream read; return whether it delivered generated output."""
        delivered = False
        for event in self.builder.take_read(data):
            payload = json_object(event.data)
            kind = payload.get("type")
            if kind in TEXT_DELTAS and type(payload.get("delta")) is str:
                self.deliver(payload["delta"])
                delivered = True
            elif kind == "response.output_item.added":
                self.count_call(payload.get("item"))
            self.failed = self.failed or kind in ("error", "response.failed")
            if type(payload.get("sequence_number")) is int:
                self.sequence = payload["sequence_number"]
            if kind in TERMINAL_EVENTS and type(payload.get("response")) is dict:
                self.end_generation()
                self.usage = reported_usage(payload["response"])
                self.finish_reason = finish_reason_of(payload["response"])
                self.terminal = payload
            elif kind == "error" or self.kept_back:
                self.kept_back.append((event.event, event.data, payload))
            else:
                self.completed.append((event.event, event.data, payload))
        return delivered

    def count_call(self, item: Any) -> None:
        """Count a hosted tool's call once its item is added: the upstream has made it."""
        tool = HOSTED_CALL_ITEMS.get(item.get("type")) if type(item) is dict else None
        if tool is not None:
            self.calls[tool] = self.calls.get(tool, 0) + 1

    def usage_so_far(self) -> Usage:
        """Return the estimate of what was delivered, with the hosted calls made so far."""
        usage = super().usage_so_far()
        if not self.calls or usage.tool_calls:
            return usage
        if usage.prompt_tokens == 0:
            # The upstream read the prompt to make its calls, though no text came yet.
            usage = replace(usage, prompt_tokens=self._prompt_tokens)
        return replace(usage, tool_calls=dict(self.calls), estimated=True)

    def events(self, items: Iterator[Any]) -> Iterator[bytes | None]:
        """Frame the relayed ``items`` (reads, flush points, the StreamEnd) as the caller's."""
        for item in items:
            if item is None:
                yield None
            elif isinstance(item, StreamEnd):
                yield self.ending(item)
            else:
                yield self.framed()

    def framed(self) -> bytes:
        """Frame the events the last reads completed."""
        framed = self.as_written(self.completed)
        self.completed.clear()
        return framed

    def as_written(self, events: list[tuple[str, str, dict[str, Any]]]) -> bytes:
        """Frame upstream events as they came, each response object answered as ours."""
        framed = []
        for name, data, payload in events:
            if type(payload.get("response")) is dict:
                self.snapshot = as_answered(self.turn, payload["response"])
                encoded = dumps_transient({**payload, "response": self.snapshot})
            else:
                # Every other event goes on as the upstream wrote it.
                encoded = data.encode()
            framed.append(written_event(name, encoded))
        return b"".join(framed)

    def ending(self, end: StreamEnd) -> bytes:
        """Frame the kept-back events, then the last one with the stream's cost; store it."""
        kept_back = self.as_written(self.kept_back)
        if self.terminal is None and self.failed:
            return kept_back
        if self.terminal is None:
            raise UpstreamError("The model's upstream ended the stream before the response.")
        response = as_answered(self.turn, self.terminal["response"], (end.usage, end.cost))
        if response.get("status") in (COMPLETED, INCOMPLETE):
            self.turn.finished(response)
        return kept_back + typed_event({**self.terminal, "response": response})

    def failure(self, error: APIError) -> bytes:
        """Frame the events that end a stream broken by ``error``: error, response.failed."""
        body, param = error_body(error), error.param
        response = self.snapshot or self.turn.draft.body(FAILED, [])
        failed = {**response, "status": FAILED, "error": body}
        events = [
            {"type": "error", **body, "param": param, "error": {**body, "param": param}},
            {"type": "response.failed", "response": failed},
        ]
        for event in events:
            self.sequence += 1
            event["sequence_number"] = self.sequence
        return typed_events(events)

    def framing(self) -> Framing:
        """Return how this stream is written: its reads framed already, its break as above."""
        return Framing(frame=bytes, error=self.failure)
