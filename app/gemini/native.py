"""A Gemini request passed through to an upstream that serves Google's Gemini API.

The caller's body goes on as sent (thought signatures, Google's hosted tools, fields the
gateway does not know) to the route's model, which the path names; one thing changes on
the way: ``generationConfig.maxOutputTokens`` is capped at what the hold covers (the
model's output limit), and set to it when the caller set none. The conversation is not
translated: the hold counts the body as it is sent (SENT_BODY, app.generations.prompts),
every part of it. The answer is the upstream's, with the gateway's generation id in
``responseId`` and the charged cost in ``usageMetadata.cost.totalCost``, as the
translated route answers. A stream's events go out as each upstream read completes
them, except those from the one that ends the candidate (its ``finishReason``) on,
which wait for the settlement: the last of them carries the cost.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from typing import Any

from app.catalog.pricing import NO_SURCHARGES, Surcharges, calls_held
from app.catalog.registry import Model
from app.encoding import dumps
from app.gemini.bodies import GEMINI_FRAMING, usage_metadata
from app.gemini.schemas import GeminiRequest
from app.generations.errors import UncountableContent
from app.generations.lifecycle import Generation, StreamEnd
from app.generations.metering import DeliveryMeter, Outcome
from app.generations.models import GEMINI
from app.generations.prompts import IMAGE, OPAQUE, BodyShape, SentPrompt, sent_prompt
from app.providers.base import ChatRequest, NativeCall, Usage
from app.providers.errors import UpstreamError
from app.providers.event_stream import EventBuilder, json_object
from app.providers.gemini import (
    BLOCKED,
    blocked,
    finish_reason_of,
    first_candidate,
    parts_of,
    reported_usage,
)
from app.sse import Framing, data_event

# The fields of a part that hold binary, as Google reads them (camelCase or snake_case).
INLINE_DATA = ("inlineData", "inline_data")
FILE_DATA = ("fileData", "file_data")
DATA_FIELDS = INLINE_DATA + FILE_DATA
# Inline data whose tokens its bytes do not tell: documents, recordings, text files.
OPAQUE_MEDIA_PREFIXES = ("application/pdf", "audio/", "video/", "text/")
# Google's hosted tools that bill per call, and the priced tool each is.
HOSTED_TOOLS = {
    "googleSearch": "web_search",
    "google_search": "web_search",
    "googleSearchRetrieval": "web_search",
    "google_search_retrieval": "web_search",
}
CACHED_CONTENT = ("cachedContent", "cached_content")


def data_field(part: dict[str, Any]) -> str | None:
    """Return the field of a part that holds binary (``inlineData``, ``fileData``), if any."""
    for name in DATA_FIELDS:
        if name in part:
            return name
    return None


def mime_type_of(data: dict[str, Any]) -> str:
    """Return the media type a Blob or FileData names ('' when it names none)."""
    mime_type = data.get("mimeType", data.get("mime_type"))
    return mime_type.lower() if type(mime_type) is str else ""


def inline_data(part: dict[str, Any]) -> str | None:
    """Count inline bytes: an image at its flat price; documents, recordings as opaque.

    Bytes of any other type cannot be counted, and are refused before anything is sent.
    """
    blob = next(part[name] for name in INLINE_DATA if name in part)
    if type(blob) is not dict:
        # Not a Blob: its strings are read as text, and the upstream refuses it.
        return None
    mime_type = mime_type_of(blob)
    if mime_type.startswith("image/"):
        return IMAGE
    if mime_type.startswith(OPAQUE_MEDIA_PREFIXES):
        return OPAQUE
    raise UncountableContent(
        f"Inline data of media type {mime_type[:64]!r} cannot be counted, so it is not "
        "sent: only images, PDFs, audio, video and text can be."
    )


def file_data(part: dict[str, Any]) -> str | None:
    """Count a file by reference: an image at its flat price, anything else as opaque."""
    data = next(part[name] for name in FILE_DATA if name in part)
    if type(data) is not dict:
        return None
    return IMAGE if mime_type_of(data).startswith("image/") else OPAQUE


# What a Gemini body passed through shows the model (app.generations.prompts): all of it
# but these settings (``generationConfig`` is counted: its schemas are read); inline
# data and files by their rules, wherever they are.
SENT_BODY = BodyShape(
    settings=frozenset(
        {"safetySettings", "safety_settings", "toolConfig", "tool_config", *CACHED_CONTENT}
    ),
    media={
        "inlineData": inline_data,
        "inline_data": inline_data,
        "fileData": file_data,
        "file_data": file_data,
    },
    kind_of=data_field,
    # A function call's arguments and response, and the schemas of functions and of the
    # output: JSON the model reads.
    free_form=frozenset(
        {
            "args",
            "response",
            "parameters",
            "parametersJsonSchema",
            "parameters_json_schema",
            "responseSchema",
            "response_schema",
            "responseJsonSchema",
            "response_json_schema",
        }
    ),
)


def prompt_of(body: dict[str, Any], model: Model) -> SentPrompt:
    """Return the prompt of a Gemini body as it is sent to ``model``.

    A body that names cached content shows the model what the cache holds, which its
    bytes do not tell: it is counted as opaque (the whole context length).
    """
    prompt = sent_prompt(body, SENT_BODY, model)
    if any(body.get(name) for name in CACHED_CONTENT):
        prompt.content.opaque += 1
    return prompt


def counted_body(body: dict[str, Any]) -> dict[str, Any]:
    """Return what countTokens counts of its body: ``contents``, or the whole request in it."""
    inner = body.get("generateContentRequest", body.get("generate_content_request"))
    return inner if type(inner) is dict else body


def surcharges_of(body: dict[str, Any]) -> Surcharges:
    """Return what a Gemini request passed through asks for that is billed beyond tokens.

    Each of Google's search tools it offers, held at the default number of calls.
    """
    calls: dict[str, int] = {}
    for tool in body.get("tools") if type(body.get("tools")) is list else ():
        for name in tool if type(tool) is dict else ():
            if priced := HOSTED_TOOLS.get(name):
                calls[priced] = calls_held(None)
    return Surcharges(tool_calls=calls) if calls else NO_SURCHARGES


def passed_request(request: GeminiRequest, model: Model) -> ChatRequest:
    """Return the normalized request of one passed through: its output cap, no messages.

    The upstream reads the body as sent, which the hold counts (SENT_BODY): translating
    the conversation would only refuse what the upstream accepts.
    """
    params = {}
    if type(request.config.get("maxOutputTokens")) is int:
        params["max_tokens"] = min(request.config["maxOutputTokens"], model.max_output_tokens)
    return ChatRequest(model=request.model, messages=[], params=params, stream=request.stream)


def native_call(body: dict[str, Any], generation: Generation, *, stream: bool) -> NativeCall:
    """Return the request to pass through: the caller's, its output capped at the hold's."""
    cap = generation.request.max_output_tokens or generation.model.max_output_tokens
    key = "generation_config" if "generation_config" in body else "generationConfig"
    config = body.get(key) if type(body.get(key)) is dict else {}
    asked = config.get("maxOutputTokens", config.get("max_output_tokens"))
    forwarded = dict(body)
    if type(asked) is not int or asked > cap:
        config = {k: v for k, v in config.items() if k != "max_output_tokens"}
        forwarded[key] = {**config, "maxOutputTokens": cap}
    return NativeCall(api=GEMINI, body=forwarded, stream=stream, model=generation.request.model)


def grounded_calls(response: dict[str, Any]) -> dict[str, int]:
    """Return the search calls an answer shows: its grounding's queries (one at least)."""
    grounding = (first_candidate(response) or {}).get("groundingMetadata")
    if type(grounding) is not dict:
        return {}
    queries = grounding.get("webSearchQueries")
    return {"web_search": max(len(queries) if type(queries) is list else 0, 1)}


def usage_of(response: dict[str, Any]) -> Usage | None:
    """Return the usage a response reports with its hosted calls, or None if it has none."""
    usage = reported_usage(response)
    if usage is None:
        return None
    calls = grounded_calls(response)
    return replace(usage, tool_calls=calls) if calls else usage


def finish_of(response: dict[str, Any]) -> str | None:
    """Return how a response's candidate ended, in the gateway's terms (None: not yet)."""
    candidate = first_candidate(response)
    if candidate is None:
        return BLOCKED if blocked(response) else None
    called = any("functionCall" in part for part in parts_of(candidate))
    return finish_reason_of(candidate.get("finishReason"), called)


def output_texts(response: dict[str, Any]) -> Iterator[str]:
    """Yield the generated text of a response's candidate: text, thoughts, call arguments."""
    for part in parts_of(first_candidate(response)):
        if type(part.get("text")) is str:
            yield part["text"]
        call = part.get("functionCall")
        if type(call) is dict:
            yield str(call.get("name") or "")
            yield dumps(call.get("args") or {}).decode()


def whole_outcome(meter: DeliveryMeter) -> Callable[[dict[str, Any]], Outcome]:
    """Return how a whole GenerateContentResponse is read: its usage, and how it ended.

    A response without its usage is billed at an estimate (``meter.answer_usage``): the
    prompt as its hold counted it, the content it generated counted.
    """

    def outcome_of(response: dict[str, Any]) -> Outcome:
        usage = usage_of(response)
        if usage is None:
            for text in output_texts(response):
                meter.deliver(text)
            usage = meter.answer_usage()
        return Outcome(usage, finish_of(response))

    return outcome_of


def answered(
    response: dict[str, Any],
    generation: Generation,
    cost: Decimal | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """Return the upstream's response as the gateway answers it: its id, and its cost.

    ``usage`` is the usage billed: shown when the upstream reported none.
    """
    answer = {**response, "responseId": generation.id}
    metadata = response.get("usageMetadata")
    if cost is not None and type(metadata) is dict:
        answer["usageMetadata"] = {**metadata, "cost": {"totalCost": cost}}
    elif cost is not None and usage is not None:
        answer["usageMetadata"] = usage_metadata(usage, cost)
    return answer


class RelayedStream(DeliveryMeter):
    """Reads a passed-through stream's events as they come: its meter, and its writer.

    ``observe`` takes each upstream read (the core's RelayMeter); ``events`` frames the
    events they completed, each under the gateway's id. From the event that ends the
    candidate on, events wait for ``ending``, which gives the last one its cost. An error
    event waits for it too: a caller who sees the stream end sees it billed.
    """

    def __init__(self, generation: Generation) -> None:
        super().__init__(generation)
        self.generation = generation
        self.builder = EventBuilder()
        # The events the last reads completed, framed; those kept back for the end.
        self.completed: list[bytes] = []
        self.kept_back: list[dict[str, Any]] = []
        # The upstream's error event, framed, kept back for the end.
        self.error_frame = b""
        # The hosted tools' calls the stream's grounding shows (see grounded_calls).
        self.calls: dict[str, int] = {}

    def observe(self, data: bytes) -> bool:
        """Read one upstream read; return whether it delivered generated output."""
        delivered = False
        for event in self.builder.take_read(data):
            delivered = self.read_event(json_object(event.data)) or delivered
        return delivered

    def read_event(self, payload: dict[str, Any]) -> bool:
        """Keep one event for its frame, or for the end; return whether it carried output."""
        if "error" in payload:
            self.failed = True
            self.error_frame += data_event(payload)
            return False
        self.take_usage(payload)
        reason = finish_of(payload)
        delivered = False
        for text in output_texts(payload):
            self.deliver(text)
            delivered = delivered or bool(text)
        if reason is not None or self.kept_back:
            self.finish_reason = reason or self.finish_reason
            self.kept_back.append(payload)
        else:
            self.completed.append(data_event(answered(payload, self.generation)))
        return delivered

    def take_usage(self, payload: dict[str, Any]) -> None:
        """Keep an event's usage, the running total, with the searches its grounding shows.

        The grounding comes on one event, usually the last, not always one with usage.
        """
        calls, usage = grounded_calls(payload), reported_usage(payload) or self.usage
        self.calls = calls or self.calls
        if usage is not None and (calls or usage is not self.usage):
            self.usage = replace(usage, tool_calls=self.calls or None)

    def final_usage(self) -> Usage:
        """Return the usage to bill: the upstream's once its candidate ended, else counted.

        Each event's ``usageMetadata`` names the prompt, but the output only so far: a
        stream that ends before its candidate does is billed for what it delivered.
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
        """Frame the kept-back events, the last with the stream's cost, then any error."""
        if self.failed and not self.kept_back:
            return self.error_frame
        if not self.kept_back:
            raise UpstreamError("The model's upstream ended the stream before its last event.")
        *first, last = self.kept_back
        framed = [data_event(answered(payload, self.generation)) for payload in first]
        framed.append(data_event(answered(last, self.generation, end.cost, end.usage)))
        return b"".join(framed) + self.error_frame

    def framing(self) -> Framing:
        """Return how this stream is written: its reads framed already, its break as ever."""
        return Framing(frame=bytes, error=GEMINI_FRAMING.error)
