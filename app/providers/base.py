"""Normalized request, result and chunk types, and the adapter interface every provider implements.

Choices and deltas keep the OpenAI wire shape (plain dicts), because that is the public
contract: an OpenAI-compatible upstream passes them through untouched, and the other
adapters translate into that shape once. Only the parts the gateway itself reasons about
(the request's limits, token usage) are typed.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from app.providers.vectors import Vector

# The reasoning efforts a request may ask for; ``none`` turns reasoning off.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat completion request, as the caller sent it.

    ``params`` holds every optional field of the contract's ChatCompletionRequest that the
    caller set (temperature, tools, response_format, ...), under its public name.
    ``extra`` holds the caller's top-level fields the contract does not know, unchecked:
    an adapter forwards only those a model's catalog entry lists in ``extra_params``.
    """

    model: str
    messages: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def max_output_tokens(self) -> int | None:
        """The caller's cap on generated tokens per choice (max_completion_tokens wins)."""
        return self.params.get("max_completion_tokens") or self.params.get("max_tokens")

    @property
    def choice_count(self) -> int:
        """How many choices were asked for (``n``)."""
        return self.params.get("n") or 1


@dataclass(frozen=True)
class EmbeddingRequest:
    """A validated embeddings request: the inputs to embed, each a text or token ids.

    ``inputs`` holds either texts or arrays of token ids, never both (the caller's
    ``input`` as one list); ``dimensions`` is the vector size asked for (None: the model's
    own), ``user`` the caller's end-user id, passed on. ``task_type`` (what the vectors are
    for: ``RETRIEVAL_QUERY``, ...) and ``titles`` (a document's title per input, or None)
    are Google's, passed on to upstreams that take them (Gemini) and ignored by the others.
    """

    model: str
    inputs: list[str] | list[list[int]]
    dimensions: int | None = None
    user: str | None = None
    task_type: str | None = None
    titles: tuple[str | None, ...] = ()

    @property
    def texts(self) -> list[str]:
        """The inputs given as text (none when they are token ids)."""
        return [item for item in self.inputs if type(item) is str]

    @property
    def title_texts(self) -> list[str]:
        """The inputs' titles, for the upstreams that are sent them (Gemini)."""
        return [title for title in self.titles if title]

    @property
    def token_arrays(self) -> list[list[int]]:
        """The inputs given as token ids (none when they are texts)."""
        return [item for item in self.inputs if type(item) is list]


@dataclass(frozen=True)
class Usage:
    """Token counts of one generation, summed over its choices.

    ``prompt_tokens`` includes ``cached_tokens`` (read from a prompt cache),
    ``cache_write_tokens`` (written to one, as Anthropic reports; of them
    ``cache_write_1h_tokens`` with a 1-hour TTL, the rest with 5 minutes) and
    ``prompt_image_tokens``; ``completion_tokens`` includes ``reasoning_tokens`` and
    ``completion_image_tokens``. ``tool_calls`` counts the hosted tools' calls the
    upstream reports (None: none), by the name the catalog prices them under;
    ``service_tier`` is the tier the upstream says it served the request in. ``estimated``
    is true when the gateway counted the tokens itself.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_image_tokens: int = 0
    reasoning_tokens: int = 0
    completion_image_tokens: int = 0
    cache_write_tokens: int = 0
    estimated: bool = False
    cache_write_1h_tokens: int = 0
    tool_calls: Mapping[str, int] | None = None
    service_tier: str | None = None

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, Any]:
        """Render in the contract's Usage shape (without ``cost``, which billing adds)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {
                "cached_tokens": self.cached_tokens,
                "cached_read_tokens": self.cached_tokens,
                "image_tokens": self.prompt_image_tokens,
            },
            "completion_tokens_details": {
                "reasoning_tokens": self.reasoning_tokens,
                "image_tokens": self.completion_image_tokens,
            },
        }


def fingerprint_of(*parts: str) -> str:
    """Return a stable ``system_fingerprint`` naming the backend that ``parts`` identify."""
    return "fp_" + hashlib.sha256("/".join(parts).encode()).hexdigest()[:12]


@dataclass
class Completion:
    """A whole answer: choices in the contract's Choice shape, and the usage they cost.

    Each choice is ``{"index", "message": {...}, "finish_reason", "logprobs"}``.
    ``stop_sequence`` is the caller's ``stop`` sequence that ended the first choice, when
    the upstream says which (or the adapter knows); None when it ended otherwise, or when
    that cannot be told (OpenAI says only ``finish_reason: stop``).
    """

    choices: list[dict[str, Any]]
    usage: Usage
    system_fingerprint: str | None = None
    stop_sequence: str | None = None


@dataclass(slots=True)
class Chunk:
    """One streamed event: choice deltas in the contract's chunk shape, or the final usage.

    Each choice is ``{"index", "delta": {...}, "finish_reason"}`` (plus ``logprobs`` when
    asked for). An adapter ends its stream with a chunk whose ``usage`` is set (its
    ``choices`` may be empty); the gateway decides whether the caller sees it.

    ``more`` says that another chunk is ready behind this one (the same upstream read
    brought both), so the gateway may send them together; False, the default, sends
    this one at once. An adapter that drops the event ending a read, after a chunk
    that said ``more``, yields a chunk with neither choices nor usage in its place.

    ``stop_sequence``, on the chunk that finishes the first choice, is as Completion's.
    Slotted: one is made for every relayed event, and read several times over.
    """

    choices: list[dict[str, Any]]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    more: bool = False
    stop_sequence: str | None = None


@dataclass
class Embeddings:
    """An embeddings answer: one vector per input, in the inputs' order, and its usage.

    Each vector is float32, as embedding models produce and OpenAI's API sends them, held
    as it came (``app.providers.vectors``).
    """

    vectors: list[Vector]
    usage: Usage


@dataclass(frozen=True)
class UpstreamConfig:
    """Where an upstream is and how to reach it, as the catalog's ``[upstreams.NAME]`` says.

    ``options`` holds the entry's other keys, for settings only one kind understands.
    """

    name: str
    kind: str
    base_url: str | None = None
    api_key_env: str | None = None
    connect_timeout: float = 3.0
    read_timeout: float = 300.0
    retries: int = 2
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteTarget:
    """What an adapter needs to know about the model it is asked to run on one upstream.

    ``upstream_model`` is the upstream's own name for the model; ``extra_params`` names
    request fields beyond the standard ones that this model accepts and that may be
    forwarded; ``capabilities`` are the catalog's (tools, json_schema, reasoning, vision);
    ``tokenizer`` names the encoding that counts the model's tokens, when the catalog says;
    ``api`` names a wire protocol the route passes requests through in, unchanged
    (``responses``: the upstream's /v1/responses), when the catalog says.
    """

    upstream_model: str
    capabilities: frozenset[str] = frozenset()
    extra_params: frozenset[str] = frozenset()
    max_output_tokens: int | None = None
    tokenizer: str | None = None
    api: str | None = None


@dataclass(frozen=True)
class NativeCall:
    """A request passed through to an upstream in its own wire format, not translated.

    ``api`` is the protocol (``responses``, ``messages``, ``gemini``); ``body`` the
    caller's, whose ``model`` becomes the route's name for it; ``headers`` the caller's
    protocol headers that go on with it (``anthropic-version``, ``anthropic-beta``).
    ``model`` is the model the caller named, for a protocol whose body does not name it
    (Gemini's path does): the route's name for it is replaced by it in messages passed on.
    """

    api: str
    body: Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: bool = False
    model: str | None = None


@dataclass(frozen=True)
class NativeAnswer:
    """A whole answer passed through: the upstream's body as sent, and decoded.

    ``decoded`` is None when the body is not a JSON object: the upstream answered, but
    what it answered cannot be read.
    """

    body: bytes
    decoded: dict[str, Any] | None


@dataclass
class PromptContent:
    """What a request's model is shown, read from the body that is sent: texts, images.

    ``texts`` are every string the model may read (keys of objects included);
    ``low_detail_images`` those asked for at low detail, on upstreams that honour it;
    ``opaque`` counts the parts whose tokens their bytes do not tell (a PDF, a file or
    a recording, sent inline or by reference).
    """

    texts: list[str] = field(default_factory=list)
    images: int = 0
    low_detail_images: int = 0
    opaque: int = 0


class Adapter(ABC):
    """Turns a ChatRequest into one upstream's protocol and back.

    Adapters know nothing of accounts or billing: they return what the upstream produced,
    and raise ``app.providers.errors.UpstreamError`` subclasses when it fails.
    """

    kind: ClassVar[str]
    # Where the upstream is when its catalog entry names no ``base_url`` (None: required).
    default_base_url: ClassVar[str | None] = None

    def __init__(self, upstream: UpstreamConfig) -> None:
        self.upstream = upstream

    @abstractmethod
    def complete(self, request: ChatRequest, target: RouteTarget) -> Completion:
        """Run the request to the end and return the whole answer."""

    @abstractmethod
    def stream(self, request: ChatRequest, target: RouteTarget) -> Iterator[Chunk]:
        """Run the request and yield its chunks as they arrive, usage last."""

    @abstractmethod
    def count_prompt_tokens(
        self, request: ChatRequest, target: RouteTarget, *, limit: int | None = None
    ) -> int:
        """Count (or estimate) the prompt tokens of ``request``, to price the hold.

        With ``limit``, counting may stop once the count passes it, returning a number
        above it: enough to refuse a prompt longer than a context window.
        """

    def prompt_token_bound(self, request: ChatRequest, target: RouteTarget) -> int:
        """Return a cheap upper bound of the prompt tokens (this default counts them)."""
        return self.count_prompt_tokens(request, target)

    @abstractmethod
    def count_text_tokens(self, text: str, target: RouteTarget) -> int:
        """Count (or estimate) the tokens of generated text, for billing a cut-off stream."""

    # What one image is assumed to cost in a hold, where an adapter has no rule of its own.
    image_tokens: int = 1_600

    def count_content_tokens(
        self, content: PromptContent, target: RouteTarget, *, limit: int | None = None
    ) -> int:
        """Count the prompt tokens of ``content`` (its opaque parts aside), erring high.

        This default counts each text as generated text, each image at ``image_tokens``.
        With ``limit``, counting may stop once the count passes it.
        """
        tokens = (content.images + content.low_detail_images) * self.image_tokens
        for text in content.texts:
            tokens += self.count_text_tokens(text, target)
            if limit is not None and tokens > limit:
                break
        return tokens

    def content_token_bound(self, content: PromptContent, target: RouteTarget) -> int:
        """Return a cheap upper bound of ``content``'s prompt tokens (this default counts them)."""
        return self.count_content_tokens(content, target)

    # Whether the upstream serves embedding models (``embed``).
    embeds: ClassVar[bool] = False

    def embed(self, request: EmbeddingRequest, target: RouteTarget) -> Embeddings:
        """Embed the request's inputs; an adapter whose upstream serves no embeddings cannot."""
        raise NotSpokenHere(self.kind, "embeddings")

    # The wire protocols the upstream speaks itself, whatever a route says.
    native_apis: ClassVar[frozenset[str]] = frozenset()

    def relay(self, call: NativeCall, target: RouteTarget) -> NativeAnswer:
        """Pass ``call`` through whole; an adapter that speaks no protocol natively cannot."""
        raise NotSpokenHere(self.kind, call.api)

    def relay_stream(self, call: NativeCall, target: RouteTarget) -> Iterator[bytes]:
        """Pass ``call`` through streamed; yield the upstream's bytes as each read brings them."""
        raise NotSpokenHere(self.kind, call.api)


class NotSpokenHere(Exception):
    """An adapter was asked to pass on a protocol its upstream does not speak: a wiring bug."""

    def __init__(self, kind: str, api: str) -> None:
        super().__init__(f"upstreams of kind {kind!r} do not speak {api!r}")


@dataclass(frozen=True)
class Route:
    """One place a model runs: an upstream's adapter and the model's name there."""

    adapter: Adapter
    target: RouteTarget

    def speaks(self, api: str) -> bool:
        """Tell whether requests of ``api`` pass through this route natively."""
        return api == self.target.api or api in self.adapter.native_apis
