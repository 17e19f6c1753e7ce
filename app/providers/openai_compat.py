"""OpenAI-compatible upstreams: own servers (vLLM, llama.cpp, Ollama, TGI) and third parties.

The request goes out as the caller sent it: the contract's fields, the extras the model's
catalog entry allows, and the upstream's name for the model; except the output limit,
sent once, as the one the credit hold was sized for (the caller's ``max_completion_tokens``
or ``max_tokens``, else the model's ``max_output_tokens``), under the field the upstream
reads (``max_tokens_field``): an upstream that read the other one could generate past
what was held. The answer comes back cut to
the contract's fields, so that nothing of the upstream (its name for the model, its own
extensions) reaches the caller; ``reasoning_content`` (vLLM, DeepSeek) becomes
``reasoning``. Streams always ask for usage, so billing uses the upstream's counts.
Embedding models are called at ``{base_url}/embeddings`` (OpenAI, vLLM, Text Embeddings
Inference, Ollama), asking for base64 (``embeddings_format``; ``float`` for a server that
refuses it): little-endian float32 bytes cost next to nothing to read, where parsing a
number per dimension costs more than the rest of the request. Vectors sent as numbers
are read too, whatever was asked; they come back in the inputs' order.
Which stop sequence ended an answer is known only from an upstream that says so
(vLLM's ``stop_reason``); OpenAI says only ``finish_reason: stop``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from operator import itemgetter
from typing import Any

from app.providers.base import (
    ChatRequest,
    Chunk,
    Completion,
    EmbeddingRequest,
    Embeddings,
    PromptContent,
    RouteTarget,
    UpstreamConfig,
    Usage,
    fingerprint_of,
)
from app.providers.errors import UpstreamError
from app.providers.event_stream import ServerSentEvent, json_object, read_events
from app.providers.http1 import UpstreamResponse
from app.providers.transport import (
    HttpUpstreamAdapter,
    as_count,
    prepared_url,
    received_chunks,
    release_response,
)
from app.providers.vectors import Vector, from_base64, from_numbers

MESSAGE_FIELDS = frozenset(
    ("role", "content", "refusal", "reasoning", "reasoning_details", "tool_calls")
)
DONE = "[DONE]"
# Read in C, per relayed chunk: whether any of its choices finished.
_FINISH_REASON = itemgetter("finish_reason")
OUTPUT_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens")
# Every OpenAI-compatible server reads max_tokens (vLLM, llama.cpp, Ollama, TGI, SGLang);
# OpenAI's reasoning models want max_completion_tokens, set per upstream.
DEFAULT_OUTPUT_LIMIT_FIELD = "max_tokens"
EMBEDDINGS_FORMATS = ("base64", "float")


def usage_from(raw: dict[str, Any], tier: Any = None, calls: dict[str, int] | None = None) -> Usage:
    """Read an OpenAI-shaped usage object (with DeepSeek's cache-hit count as a fallback).

    ``tier`` is the ``service_tier`` the answer says it was served in, when it says one;
    ``calls`` the hosted tools' calls the answer made, which the usage does not count.
    """
    prompt_details = raw.get("prompt_tokens_details") or {}
    completion_details = raw.get("completion_tokens_details") or {}
    prompt = as_count(raw.get("prompt_tokens"))
    cached = as_count(prompt_details.get("cached_tokens")) or as_count(
        raw.get("prompt_cache_hit_tokens")
    )
    cached = min(cached, prompt)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=as_count(raw.get("completion_tokens")),
        cached_tokens=cached,
        prompt_image_tokens=min(as_count(prompt_details.get("image_tokens")), prompt - cached),
        reasoning_tokens=as_count(completion_details.get("reasoning_tokens")),
        service_tier=tier if type(tier) is str else None,
        tool_calls=calls,
    )


# The field that makes an OpenAI search model search the web (gpt-4o-search-preview and
# the like): it searches once for each request that has it, a call of ``web_search``.
WEB_SEARCH_OPTIONS = "web_search_options"
ONE_SEARCH = {"web_search": 1}


def searches_of(request: ChatRequest, target: RouteTarget) -> dict[str, int] | None:
    """Return the web search calls that ``request`` makes on ``target``: one, or none."""
    if WEB_SEARCH_OPTIONS in request.extra and WEB_SEARCH_OPTIONS in target.extra_params:
        return dict(ONE_SEARCH)
    return None


def public_fields(message: dict[str, Any]) -> dict[str, Any]:
    """Keep the contract's fields of a message or delta that are set; rename reasoning.

    A message that holds only such fields is returned itself, not copied.
    """
    values = message.values()
    if MESSAGE_FIELDS.issuperset(message) and None not in values and [] not in values:
        # Nearly every delta: its text alone, checked in C without a copy's walk.
        return message
    # A delta holds a field or two of the six: going over its own is the shorter walk.
    fields = {
        key: value
        for key, value in message.items()
        if key in MESSAGE_FIELDS and value is not None and value != []
    }
    if "reasoning" not in fields and message.get("reasoning_content"):
        fields["reasoning"] = message["reasoning_content"]
    return fields


def choice_from(raw: dict[str, Any]) -> dict[str, Any]:
    """Read one choice of a whole answer into the contract's Choice shape."""
    message = {"role": "assistant", "content": None, "refusal": None}
    message.update(public_fields(raw.get("message") or {}))
    return {
        "index": raw.get("index", 0),
        "message": message,
        "finish_reason": raw.get("finish_reason"),
        "logprobs": raw.get("logprobs"),
    }


def delta_choice_from(raw: dict[str, Any]) -> dict[str, Any]:
    """Read one choice of a stream chunk into the contract's chunk choice shape."""
    # Built here, not taken from the upstream: its keys in the contract's order.
    choice = {
        "index": raw.get("index", 0),
        "delta": public_fields(raw.get("delta") or {}),
        "finish_reason": raw.get("finish_reason"),
    }
    if raw.get("logprobs") is not None:
        choice["logprobs"] = raw["logprobs"]
    return choice


NO_STOPS: frozenset[str] = frozenset()


def stop_sequences(request: ChatRequest) -> frozenset[str]:
    """Return the caller's ``stop`` sequences."""
    stop = request.params.get("stop")
    if not stop:
        return NO_STOPS
    return frozenset([stop] if isinstance(stop, str) else stop)


def matched_stop(raw: dict[str, Any], stops: frozenset[str]) -> str | None:
    """Return the caller's stop sequence an upstream's first choice says it ended on.

    vLLM's ``stop_reason`` names the stop string (or token id) that ended a choice; OpenAI
    sends none, and most requests have no stop sequence: both are answered first.
    """
    if not stops:
        return None
    stop = raw.get("stop_reason")
    if type(stop) is not str or raw.get("index", 0) != 0 or raw.get("finish_reason") != "stop":
        return None
    return stop if stop in stops else None


def generated_texts(choices: list[dict[str, Any]]) -> Iterator[tuple[str, str | None]]:
    """Yield (kind, text) for every generated text of whole choices: content, reasoning, calls."""
    for choice in choices:
        message = choice["message"]
        yield "content", message.get("content")
        yield "reasoning", message.get("reasoning")
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            yield "tool_call", function.get("name")
            yield "tool_call", function.get("arguments")


class OpenAICompatAdapter(HttpUpstreamAdapter):
    """Calls ``{base_url}/chat/completions`` of any OpenAI-compatible server.

    A route that says ``api = "responses"`` passes OpenAI's Responses API through to
    ``{base_url}/responses`` (OpenAI, vLLM).
    """

    kind = "openai"
    native_paths = {"responses": "/responses"}
    embeds = True

    def __init__(self, upstream: UpstreamConfig) -> None:
        super().__init__(upstream)
        base = (upstream.base_url or "").rstrip("/")
        self.url = prepared_url(f"{base}/chat/completions")
        self.embeddings_url = prepared_url(f"{base}/embeddings")
        self.output_limit_field = upstream.options.get(
            "max_tokens_field", DEFAULT_OUTPUT_LIMIT_FIELD
        )
        if self.output_limit_field not in OUTPUT_LIMIT_FIELDS:
            raise ValueError(f"max_tokens_field must be one of {', '.join(OUTPUT_LIMIT_FIELDS)}")
        self.embeddings_format = upstream.options.get("embeddings_format", "base64")
        if self.embeddings_format not in EMBEDDINGS_FORMATS:
            raise ValueError(f"embeddings_format must be one of {', '.join(EMBEDDINGS_FORMATS)}")

    def headers(self) -> dict[str, str]:
        """Return the request headers, with the upstream's key as a bearer token if it has one."""
        headers = {"Content-Type": "application/json"}
        if key := self.api_key():
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def request_body(self, request: ChatRequest, target: RouteTarget) -> dict[str, Any]:
        """Build the upstream's request: the caller's fields, its name for the model."""
        params = {k: v for k, v in request.params.items() if k not in OUTPUT_LIMIT_FIELDS}
        body = {"model": target.upstream_model, "messages": request.messages, **params}
        if limit := request.max_output_tokens or target.max_output_tokens:
            body[self.output_limit_field] = limit
        for key, value in request.extra.items():
            if key in target.extra_params:
                body[key] = value
        if request.stream:
            # Always: the gateway bills from it, and decides itself what the caller sees.
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def complete(self, request: ChatRequest, target: RouteTarget) -> Completion:
        """Ask for the whole answer; count its tokens if the upstream reports no usage."""
        response = self.call(request, target)
        body = self.read_json(response)
        raw_choices = body.get("choices")
        if not isinstance(raw_choices, list) or not raw_choices:
            raise UpstreamError("The model's upstream answered without a choice.")
        choices = [choice_from(choice) for choice in raw_choices]
        raw_usage = body.get("usage")
        if isinstance(raw_usage, dict) and as_count(raw_usage.get("total_tokens")):
            usage = usage_from(raw_usage, body.get("service_tier"), searches_of(request, target))
        else:
            usage = self.estimate_usage(request, target, choices)
            if calls := searches_of(request, target):
                usage = replace(usage, tool_calls=calls)
        fingerprint = body.get("system_fingerprint")
        if not isinstance(fingerprint, str):
            fingerprint = self.fingerprint(target)
        stop = matched_stop(raw_choices[0], stop_sequences(request))
        return Completion(choices, usage, fingerprint, stop)

    def stream(self, request: ChatRequest, target: RouteTarget) -> Iterator[Chunk]:
        """Relay the upstream's chunks as they arrive, then its usage if it sent one."""
        response = self.call(request, target)
        relay = StreamRelay(
            self.fingerprint(target), stop_sequences(request), searches_of(request, target)
        )
        complete = False
        try:
            # Each event is relayed by a call, not in this loop's body, whose variables
            # would keep the last event for as long as the stream waits for the next.
            for chunk in map(relay.chunk_for, read_events(received_chunks(response))):
                if chunk is not None:
                    yield chunk
                if relay.done:
                    break
            yield from relay.last_chunks()
            complete = True
        finally:
            # Also when the caller went away: closing drops the connection, which stops
            # the upstream generating (and charging for) tokens nobody will read.
            release_response(response, complete=complete)

    def embed(self, request: EmbeddingRequest, target: RouteTarget) -> Embeddings:
        """Ask for the inputs' vectors; count the inputs if the upstream reports no usage."""
        body: dict[str, Any] = {
            "model": target.upstream_model,
            "input": request.inputs,
            "encoding_format": self.embeddings_format,
        }
        if request.dimensions is not None:
            body["dimensions"] = request.dimensions
        if request.user is not None:
            body["user"] = request.user
        response = self.post(
            self.embeddings_url, body, self.headers(), stream=False, public_model=request.model
        )
        answer = self.read_json(response)
        vectors = vectors_from(answer.get("data"), len(request.inputs))
        raw_usage = answer.get("usage")
        if isinstance(raw_usage, dict) and as_count(raw_usage.get("prompt_tokens")):
            usage = Usage(prompt_tokens=as_count(raw_usage.get("prompt_tokens")))
        else:
            usage = self.estimate_embedding_usage(request, target)
        return Embeddings(vectors=vectors, usage=usage)

    def estimate_embedding_usage(self, request: EmbeddingRequest, target: RouteTarget) -> Usage:
        """Count the inputs' tokens of an embeddings answer whose upstream reported none."""
        texts = self.count_content_tokens(PromptContent(texts=request.texts), target)
        token_ids = sum(map(len, request.token_arrays))
        return Usage(prompt_tokens=texts + token_ids, estimated=True)

    def fingerprint(self, target: RouteTarget) -> str:
        """Return the system_fingerprint for answers whose upstream sent none (vLLM, llama.cpp)."""
        return fingerprint_of(self.kind, self.upstream.name, target.upstream_model)

    def call(self, request: ChatRequest, target: RouteTarget) -> UpstreamResponse:
        """Send the request; return the upstream's successful response."""
        return self.post(
            self.url,
            self.request_body(request, target),
            self.headers(),
            stream=request.stream,
            public_model=request.model,
        )

    def estimate_usage(
        self, request: ChatRequest, target: RouteTarget, choices: list[dict[str, Any]]
    ) -> Usage:
        """Count the usage of a whole answer whose upstream reported none."""
        completion = reasoning = 0
        for kind, text in generated_texts(choices):
            tokens = self.count_text_tokens(text, target) if text else 0
            completion += tokens
            reasoning += tokens if kind == "reasoning" else 0
        return Usage(
            prompt_tokens=self.count_prompt_tokens(request, target),
            completion_tokens=completion,
            reasoning_tokens=reasoning,
            estimated=True,
        )


def vectors_from(data: Any, count: int) -> list[Vector]:
    """Return the vectors of an embeddings answer's ``data``, ordered by their ``index``.

    A vector comes as base64 of little-endian float32, or as numbers (a server that
    answers so whatever was asked). Anything else, or not one vector per input, is the
    upstream failing.
    """
    if not isinstance(data, list) or len(data) != count:
        raise UpstreamError("The model's upstream answered without one vector per input.")
    vectors: list[Vector | None] = [None] * count
    for position, item in enumerate(data):
        item = item if isinstance(item, dict) else {}
        index = item.get("index", position)
        raw = item.get("embedding")
        vector = from_base64(raw) if isinstance(raw, str) else from_numbers(raw)
        if type(index) is not int or not 0 <= index < count or vector is None:
            raise UpstreamError("The model's upstream answered a vector the gateway cannot read.")
        vectors[index] = vector
    if any(vector is None for vector in vectors):
        raise UpstreamError("The model's upstream answered without one vector per input.")
    return vectors  # type: ignore[return-value]


class StreamRelay:
    """Turns an OpenAI-compatible stream's events into chunks, one call each, usage last.

    Usage may come on a chunk of its own (OpenAI, vLLM) or on the last chunk with choices;
    either way it is relayed after every choice: at once when it comes alone after them
    (so that a worker that dies before the stream's end has it recorded with its
    progress), else at the end. A stream that ends without ``[DONE]``
    is complete only if it finished its choices. Chunks carry the upstream's
    system_fingerprint, or the gateway's when it sends none, and say ``more`` while
    their upstream read has more events.
    """

    def __init__(
        self,
        fingerprint: str,
        stops: frozenset[str] = frozenset(),
        calls: dict[str, int] | None = None,
    ) -> None:
        self.fingerprint = fingerprint
        # The hosted tools' calls the answer makes, which its usage does not count.
        self.calls = calls
        # The caller's stop sequences, one of which the upstream may say ended the answer.
        self.stops = stops
        self.usage: Usage | None = None
        self.usage_relayed = False
        # Every choice finished, or [DONE] came; done: [DONE] came, nothing is left to read.
        self.finished = self.done = False
        # The last chunk relayed said more, and no chunk since has ended its read.
        self.held = False

    def chunk_for(self, event: ServerSentEvent) -> Chunk | None:
        """Return the chunk to relay for ``event``, if any."""
        if event.data == DONE:
            self.finished = self.done = True
            return None
        payload = json_object(event.data)
        if event.event == "error" or payload.get("error"):
            # OpenRouter and vLLM report a failure mid-stream as an event carrying ``error``.
            raise UpstreamError("The model's upstream failed mid-answer.")
        if isinstance(raw_usage := payload.get("usage"), dict):
            self.usage = usage_from(raw_usage, payload.get("service_tier"), self.calls)
        if raw_choices := payload.get("choices"):
            # Nearly every chunk has one choice: read without a comprehension's call.
            if len(raw_choices) == 1:
                choices = [delta_choice_from(raw_choices[0])]
            else:
                choices = [delta_choice_from(choice) for choice in raw_choices]
            self.finished = self.finished or any(map(_FINISH_REASON, choices))
            if isinstance(fingerprint := payload.get("system_fingerprint"), str):
                self.fingerprint = fingerprint
            self.held = more = event.more
            # Positional: keyword arguments cost a relayed chunk's construction more.
            chunk = Chunk(choices, None, self.fingerprint, more)
            if self.stops and choices[0]["finish_reason"]:
                chunk.stop_sequence = matched_stop(raw_choices[0], self.stops)
            return chunk
        if self.finished and isinstance(raw_usage, dict):
            # The usage alone, after every choice: the stream's last chunk, sent at once.
            self.usage_relayed = True
            self.held = False
            return Chunk([], self.usage, self.fingerprint)
        if self.held and not event.more:
            # The read ends on an event without choices: what came before it goes now.
            self.held = False
            return Chunk(choices=[], system_fingerprint=self.fingerprint)
        return None

    def last_chunks(self) -> list[Chunk]:
        """Return what follows the events: the usage, if the upstream sent it.

        Without usage, an empty chunk sends what a read left held: releasing the
        connection may wait for the body's end, and the last chunks go first.

        :raise UpstreamError: the stream ended before its choices finished.
        """
        if not self.finished:
            raise UpstreamError("The model's upstream ended the answer early.")
        if self.usage is not None and not self.usage_relayed:
            return [Chunk(choices=[], usage=self.usage, system_fingerprint=self.fingerprint)]
        if self.held:
            return [Chunk(choices=[], system_fingerprint=self.fingerprint)]
        return []
