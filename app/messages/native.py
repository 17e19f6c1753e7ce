"""A Messages request passed through to an upstream that serves Anthropic's Messages API.

The caller's body goes on as sent (thinking blocks and their signatures, ``cache_control``,
server tools, fields the gateway does not know) with the caller's ``anthropic-version``
and ``anthropic-beta``; two things change on the way: the model becomes the route's name
for it, and ``max_tokens`` is capped at what the hold covers (the model's output limit),
a thinking budget with it. The conversation is not translated: the hold counts the body
as it is sent (SENT_BODY, app.generations.prompts), every block of it. The answer is the
upstream's, with the gateway's message id, the model's public id and the charged cost in
``usage.cost``. A stream's events go out as each upstream read completes them, except the
last two (``message_delta``, whose usage gets the cost, and ``message_stop``), which wait
for the settlement.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from typing import Any

from app.catalog.pricing import NO_SURCHARGES, Surcharges, calls_held
from app.catalog.registry import Model
from app.encoding import dumps
from app.generations.errors import UncountableContent
from app.generations.lifecycle import Generation, StreamEnd
from app.generations.metering import DeliveryMeter, Metered, Outcome
from app.generations.models import MESSAGES
from app.generations.prompts import IMAGE, OPAQUE, BodyShape, image, opaque
from app.messages.bodies import MESSAGE_STOP, MESSAGES_FRAMING, usage_body
from app.messages.schemas import IMAGE_MEDIA_TYPES, MessagesRequest
from app.providers.anthropic import (
    FINISH_REASONS,
    called_tool,
    counted_calls,
    kept_usage,
    usage_from,
)
from app.providers.base import ChatRequest, NativeCall, Usage
from app.providers.errors import UpstreamError
from app.providers.event_stream import EventBuilder, json_object
from app.sse import Framing, typed_event, written_event

# The caller's headers that go on with a passed-through request.
PASSED_ON_HEADERS = ("anthropic-version", "anthropic-beta")
# The deltas whose text is generated output: what a cut-off stream delivered.
DELTA_TEXTS = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}
# Anthropic's smallest thinking budget; a capped budget never goes below it.
MIN_THINKING_BUDGET = 1024
# Server tools billed per call, by their type without its version date
# (``web_search_20250305``), and the priced tool each is.
SERVER_TOOLS = {
    "web_search": "web_search",
    "web_fetch": "web_fetch",
    "code_execution": "code_execution",
    "mcp_toolset": "mcp",
}
VERSION_DATE = re.compile(r"_\d{8}$")


def surcharges_of(body: dict[str, Any]) -> Surcharges:
    """Return what a Messages request passed through asks for that is billed beyond tokens.

    Its ``service_tier``; each server tool it offers, held at its ``max_uses``; MCP
    servers (``mcp_servers``) and a container (``container``, or the code execution
    tool, which runs in one) held at one container per answer.
    """
    calls: dict[str, int] = {}
    for tool in body.get("tools") if type(body.get("tools")) is list else ():
        kind = tool.get("type") if type(tool) is dict else None
        priced = SERVER_TOOLS.get(VERSION_DATE.sub("", kind)) if type(kind) is str else None
        if priced is not None:
            calls[priced] = calls.get(priced, 0) + calls_held(tool.get("max_uses"))
    if body.get("mcp_servers"):
        calls.setdefault("mcp", calls_held(None))
    if body.get("container") or "code_execution" in calls:
        calls["container"] = 1
    tier = body.get("service_tier")
    if not calls and type(tier) is not str:
        return NO_SURCHARGES
    return Surcharges(tier=tier if type(tier) is str else None, tool_calls=calls)


PDF = "application/pdf"
# The sources of a document whose text the body itself holds.
TEXT_SOURCES = ("text", "content")


def base64_source(source: dict[str, Any]) -> str:
    """Count inline binary: an image at its flat price, a PDF as opaque; refuse the rest."""
    media_type = source.get("media_type")
    if media_type in IMAGE_MEDIA_TYPES:
        return IMAGE
    if media_type == PDF:
        return OPAQUE
    raise UncountableContent(
        f"Base64 content of media type {str(media_type)[:64]!r} cannot be counted, so it "
        f"is not sent: only images ({', '.join(IMAGE_MEDIA_TYPES)}) and PDFs can be."
    )


def document(block: dict[str, Any]) -> str | None:
    """Count a document: read where the body holds its text; else inline binary, or opaque."""
    source = block.get("source")
    kind = source.get("type") if type(source) is dict else None
    if kind in TEXT_SOURCES:
        return None
    if kind == "base64":
        return base64_source(source)
    if kind in ("url", "file"):
        return OPAQUE
    raise UncountableContent(
        f"A document whose source is of type {str(kind)[:64]!r} cannot be counted, so it is "
        "not sent: its source must be text, content, base64, url or file."
    )


# What a Messages body passed through shows the model (app.generations.prompts): all of
# it but these settings; images, documents and sources by their rules, wherever they are
# (in a tool result, a search result, a server tool's result, a block of a new type).
SENT_BODY = BodyShape(
    settings=frozenset(
        {
            "model",
            "max_tokens",
            "stream",
            "temperature",
            "top_p",
            "top_k",
            "stop_sequences",
            "metadata",
            "thinking",
            "tool_choice",
            "service_tier",
        }
    ),
    media={
        "image": image,
        "document": document,
        "base64": base64_source,
        "url": opaque,
        "file": opaque,
    },
    # A tool call's input and the schemas of tools and of the output: JSON the model reads.
    free_form=frozenset({"input", "input_schema", "schema"}),
)


def passed_request(request: MessagesRequest, model: Model) -> ChatRequest:
    """Return the normalized request of one passed through: its output cap, no messages.

    The upstream reads the body as sent, which the hold counts (SENT_BODY): translating
    the conversation would only refuse what the upstream accepts.
    """
    params = {}
    if request.max_tokens is not None:
        params["max_tokens"] = min(request.max_tokens, model.max_output_tokens)
    return ChatRequest(model=request.model, messages=[], params=params, stream=request.stream)


def native_call(
    body: dict[str, Any], generation: Generation, headers: Mapping[str, str], *, stream: bool
) -> NativeCall:
    """Return the request to pass through: the caller's, capped at what the hold covers."""
    forwarded = dict(body)
    cap = generation.request.max_output_tokens or generation.model.max_output_tokens
    if type(body.get("max_tokens")) is int and body["max_tokens"] > cap:
        forwarded["max_tokens"] = cap
        forwarded["thinking"] = capped_thinking(body.get("thinking"), cap)
    passed_on = {name: headers[name] for name in PASSED_ON_HEADERS if name in headers}
    return NativeCall(api=MESSAGES, body=forwarded, headers=passed_on, stream=stream)


def capped_thinking(thinking: Any, max_tokens: int) -> Any:
    """Return ``thinking`` with a budget below ``max_tokens``, as Anthropic requires."""
    budget = thinking.get("budget_tokens") if type(thinking) is dict else None
    if type(budget) is not int or budget < max_tokens:
        return thinking
    return {**thinking, "budget_tokens": max(max_tokens - 1, MIN_THINKING_BUDGET)}


def whole_outcome(generation: Metered) -> Callable[[dict[str, Any]], Outcome]:
    """Return how a whole Message is read: its usage, and why it stopped.

    The usage counts cache reads and writes in the prompt; the server tools it called are
    those its usage counts and its blocks show. A Message without its usage is billed at
    an estimate (``DeliveryMeter.answer_usage``): the prompt as its hold counted it, the content
    it generated counted.
    """

    def outcome_of(response: dict[str, Any]) -> Outcome:
        reason = response.get("stop_reason")
        finish_reason = FINISH_REASONS.get(reason, "stop") if reason else None
        usage = response.get("usage")
        if type(usage) is dict and type(usage.get("input_tokens")) is int:
            calls = counted_calls(response.get("content"), response.get("container"))
            return Outcome(usage_from(usage, counted=calls), finish_reason)
        meter = DeliveryMeter(generation)
        for text in output_texts(response.get("content")):
            meter.deliver(text)
        return Outcome(meter.answer_usage(), finish_reason)

    return outcome_of


def output_texts(content: Any) -> Iterator[str]:
    """Yield the generated text of a Message's blocks: text, thinking, tool inputs."""
    for block in content if type(content) is list else ():
        if type(block) is not dict:
            continue
        for key in ("text", "thinking"):
            if type(block.get(key)) is str:
                yield block[key]
        if "input" in block:
            yield dumps(block["input"]).decode()


def answered(
    response: dict[str, Any],
    generation: Generation,
    cost: Decimal | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """Return the upstream's Message as the gateway answers it: its id, model and cost.

    ``usage`` is the usage billed: shown when the upstream reported none.
    """
    message = {**response, "id": generation.id, "model": generation.request.model}
    if cost is not None and type(response.get("usage")) is dict:
        message["usage"] = {**response["usage"], "cost": {"total_cost": cost}}
    elif cost is not None and usage is not None:
        message["usage"] = usage_body(usage, cost)
    return message


class RelayedStream(DeliveryMeter):
    """Reads a passed-through stream's events as they come: its meter, and its writer.

    ``observe`` takes each upstream read (the core's RelayMeter); ``events`` frames the
    events they completed. ``message_start`` is answered as the gateway's message; from
    ``message_delta`` on, events wait for ``ending``, which gives the usage its cost. An
    ``error`` event waits for it too: a caller who sees the stream end sees it billed.
    """

    def __init__(self, generation: Generation) -> None:
        super().__init__(generation)
        self.generation = generation
        self.builder = EventBuilder()
        # The events the last reads completed, framed; those kept back for the end.
        self.completed: list[bytes] = []
        self.kept_back: list[dict[str, Any]] = []
        # message_start's usage, updated by message_delta's (its output is a running total).
        self.counts: dict[str, Any] = {}
        # The server tools' calls its blocks show (see counted_calls).
        self.calls: dict[str, int] = {}
        # The upstream's error event, framed as it came, kept back for the end.
        self.error_frame = b""

    def observe(self, data: bytes) -> bool:
        """Read one upstream read; return whether it delivered generated output."""
        delivered = False
        for event in self.builder.take_read(data):
            payload = json_object(event.data)
            delivered = self.read_event(event.event, event.data, payload) or delivered
        return delivered

    def read_event(self, name: str, data: str, payload: dict[str, Any]) -> bool:
        """Keep one event for its frame, or for the end; return whether it carried output."""
        kind = payload.get("type")
        if kind == "message_start" and type(payload.get("message")) is dict:
            self.take_usage(payload["message"].get("usage"))
            message = answered(payload["message"], self.generation)
            self.completed.append(typed_event({**payload, "message": message}))
        elif kind == "message_delta" or self.kept_back:
            delta = payload.get("delta") if type(payload.get("delta")) is dict else {}
            if type(delta.get("container")) is dict:
                self.calls["container"] = 1
            self.take_usage(payload.get("usage"))
            if kind == "message_delta":
                self.end_generation()
            reason = delta.get("stop_reason")
            if reason:
                self.finish_reason = FINISH_REASONS.get(reason, "stop")
            self.kept_back.append(payload)
        elif kind == "error":
            self.failed = True
            self.error_frame += written_event(name, data.encode())
        else:
            # Every other event goes on as the upstream wrote it.
            self.completed.append(written_event(name, data.encode()))
            if kind == "content_block_start":
                self.count_call(payload.get("content_block"))
            return self.delivered_text(payload)
        return False

    def count_call(self, block: Any) -> None:
        """Count a block that calls a server tool whose calls the usage does not count."""
        if tool := called_tool(block):
            self.calls[tool] = self.calls.get(tool, 0) + 1
            self.usage = usage_from(self.counts, counted=self.calls)

    def delivered_text(self, payload: dict[str, Any]) -> bool:
        """Hand a content delta's generated text to the meter; return whether it had some."""
        delta = payload.get("delta") if payload.get("type") == "content_block_delta" else None
        key = DELTA_TEXTS.get(delta.get("type")) if type(delta) is dict else None
        text = delta.get(key) if key else None
        if type(text) is not str or not text:
            return False
        self.deliver(text)
        return True

    def take_usage(self, usage: Any) -> None:
        """Keep the counts of a usage object; the upstream's usage is complete at the end."""
        if type(usage) is dict:
            self.counts.update(kept_usage(usage))
            self.usage = usage_from(self.counts, counted=self.calls)

    def final_usage(self) -> Usage:
        """Return the usage to bill: the upstream's once its message_delta came, else counted.

        ``message_start``'s usage names the prompt but only the first output token: a
        stream that ends without a ``message_delta`` (an upstream's error event) is billed
        for what it delivered.
        """
        if self.kept_back:
            return super().final_usage()
        return self.usage_so_far()

    def events(self, items: Iterator[Any]) -> Iterator[bytes | None]:
        """Frame the relayed ``items`` (reads, flush points, the StreamEnd) as the caller's."""
        for item in items:
            if item is None:
                yield None
            elif isinstance(item, StreamEnd):
                yield self.ending(item)
            else:
                framed = b"".join(self.completed)
                self.completed.clear()
                yield framed

    def ending(self, end: StreamEnd) -> bytes:
        """Frame the kept-back events with the stream's cost, after the upstream's error event."""
        if self.failed and not self.kept_back:
            return self.error_frame
        if not self.kept_back:
            raise UpstreamError("The model's upstream ended the stream before its last event.")
        framed = [self.error_frame]
        for payload in self.kept_back:
            if payload.get("type") == "message_delta":
                usage = payload.get("usage") if type(payload.get("usage")) is dict else {}
                payload = {**payload, "usage": {**usage, "cost": {"total_cost": end.cost}}}
            framed.append(typed_event(payload))
        if self.kept_back[-1].get("type") != MESSAGE_STOP["type"]:
            framed.append(typed_event(MESSAGE_STOP))
        return b"".join(framed)

    def framing(self) -> Framing:
        """Return how this stream is written: its reads framed already, its break as ever."""
        return Framing(frame=bytes, error=MESSAGES_FRAMING.error)
