"""What a generation's prompt is counted as: its normalized request, or the body that is sent.

A translated request shows its model the normalized messages, which its route's adapter
counts. A request passed through shows the upstream the caller's body (the whole of it,
blocks and items the gateway never parses included), so its prompt is read from that
body: every string in it is text the model may read (ids, types and signatures too:
inside a tool's input or schema any key may hold content, and leaving one out would let
content through uncounted), each number as it is written, objects' keys as much as their
values. Only the door's settings (``model``, ``max_tokens``, ``temperature``...) are left
out, at the top of the body, and binary parts, counted by their door's rules instead:

- an image costs a flat price (the route's ``image_tokens``, less at low detail where the
  upstream honours it), never its bytes;
- a part whose tokens its bytes do not tell (a PDF, a file, a recording, inline or by
  reference) is opaque: the upstream may fill with it whatever the model's context leaves,
  so a prompt that holds one is counted as the whole context length;
- binary no rule covers (base64 of an unknown media type) cannot be counted, and is refused
  (UncountableContent) before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from app.catalog.registry import Model
from app.generations.errors import UncountableContent, UnsupportedContent
from app.providers.base import ChatRequest, EmbeddingRequest, PromptContent, Route

# What a door's rule counts a typed object as: the PromptContent field it adds one to.
IMAGE, LOW_DETAIL_IMAGE, OPAQUE = "images", "low_detail_images", "opaque"
# A door's rule for objects of one kind: IMAGE, LOW_DETAIL_IMAGE or OPAQUE; None to
# read the object as any other; UncountableContent raised for what cannot be counted.
MediaRule = Callable[[dict[str, Any]], str | None]
# How a door's objects name their kind, which picks their rule.
KindOf = Callable[[dict[str, Any]], Any]


def typed(block: dict[str, Any]) -> Any:
    """Return an object's kind as the Messages and Responses APIs name it: its ``type``."""
    return block.get("type")


class Prompt(Protocol):
    """A prompt as its hold counts it: a cheap upper bound, and a count (erring high)."""

    def bound(self) -> int:
        """Return an upper bound of the prompt's tokens, without tokenizing."""

    def count(self, *, limit: int | None = None) -> int:
        """Count the prompt's tokens; with ``limit``, stop once the count passes it."""


@dataclass(frozen=True)
class TranslatedPrompt:
    """The prompt of a normalized request, counted by the route that runs it."""

    request: ChatRequest
    route: Route

    def bound(self) -> int:
        """Return the route's upper bound of the request's prompt tokens."""
        return self.route.adapter.prompt_token_bound(self.request, self.route.target)

    def count(self, *, limit: int | None = None) -> int:
        """Count the request's prompt tokens as the route does."""
        return self.route.adapter.count_prompt_tokens(self.request, self.route.target, limit=limit)


@dataclass(frozen=True)
class BodyShape:
    """How a door's request body holds its prompt.

    ``settings`` are the top-level fields that are not shown to the model; ``media`` the
    rules for the objects that carry binary content, by their kind. ``kind_of`` reads an
    object's kind: its ``type``, or, where an object holds its binary in a field named for
    it (Gemini's ``{"inlineData": ...}``), that field's name; the object's other fields
    are then read as any others.
    """

    settings: frozenset[str]
    media: Mapping[str, MediaRule]
    kind_of: KindOf = typed
    # Fields, at any depth, whose value the model reads as plain JSON (a tool call's
    # arguments, a schema): no media rule applies inside them, since an object there
    # that looks like an image or a file is text to the model, to be counted as text.
    free_form: frozenset[str] = frozenset()


# How a free-form field's value is read: every string, key and number as text.
PLAIN_JSON = BodyShape(settings=frozenset(), media={})


@dataclass(frozen=True)
class SentPrompt:
    """The prompt of a body passed through, counted by the route it is sent to."""

    content: PromptContent
    route: Route
    context_length: int

    def bound(self) -> int:
        """Return an upper bound of the body's prompt tokens (see the module)."""
        return self.widened(self.route.adapter.content_token_bound(self.content, self.route.target))

    def count(self, *, limit: int | None = None) -> int:
        """Count the body's prompt tokens (see the module)."""
        tokens = self.route.adapter.count_content_tokens(
            self.content, self.route.target, limit=limit
        )
        return self.widened(tokens)

    def widened(self, tokens: int) -> int:
        """Return ``tokens``, or the whole context length when opaque parts may fill it."""
        return max(tokens, self.context_length) if self.content.opaque else tokens


# What a hold adds for each input of an embeddings request beyond its own tokens: the
# tokens an upstream's tokenizer may frame it with (BERT's [CLS] and [SEP], a BOS and EOS).
INPUT_FRAMING_TOKENS = 2


@dataclass(frozen=True)
class EmbeddingInputs:
    """The inputs of an embeddings request, counted by the route that embeds them.

    Texts are counted as the route counts any text (bounded by their UTF-8 size); token
    ids are one token each. Every input adds INPUT_FRAMING_TOKENS: the hold covers an
    upstream that frames each one, and the charge is what the upstream reports. Titles
    (Google's) are counted as texts: the upstreams that take them bill them.
    """

    request: EmbeddingRequest
    route: Route

    def bound(self) -> int:
        """Return an upper bound of the inputs' tokens, without tokenizing."""
        adapter, target = self.route.adapter, self.route.target
        return adapter.content_token_bound(self._content(), target) + self._fixed()

    def count(self, *, limit: int | None = None) -> int:
        """Count the inputs' tokens as the route does; with ``limit``, stop past it."""
        adapter, target = self.route.adapter, self.route.target
        return adapter.count_content_tokens(self._content(), target, limit=limit) + self._fixed()

    def _content(self) -> PromptContent:
        return PromptContent(texts=self.request.texts + self.request.title_texts)

    def _fixed(self) -> int:
        ids = sum(map(len, self.request.token_arrays))
        return ids + INPUT_FRAMING_TOKENS * len(self.request.inputs)


def image(block: dict[str, Any]) -> str:
    """Count an image block: at a flat price, less when it asks for low detail."""
    return LOW_DETAIL_IMAGE if block.get("detail") == "low" else IMAGE


def opaque(block: dict[str, Any]) -> str:
    """Count a block whose tokens its bytes do not tell (see the module)."""
    return OPAQUE


def sent_prompt(body: Mapping[str, Any], shape: BodyShape, model: Model) -> SentPrompt:
    """Return the prompt of ``body``, sent to ``model``'s first route.

    :raise UncountableContent: the body carries binary no rule of its door covers.
    :raise UnsupportedContent: it carries images, and the model takes none.
    """
    content = read_content(body, shape)
    if (content.images or content.low_detail_images) and "vision" not in model.capabilities:
        raise UnsupportedContent(f"Model '{model.id}' does not accept image input.")
    return SentPrompt(content, model.routes[0], model.context_length)


def read_content(body: Mapping[str, Any], shape: BodyShape) -> PromptContent:
    """Gather what ``body`` shows its model: every field's content but the settings'."""
    content = PromptContent()
    for key, value in body.items():
        if key in shape.settings:
            continue
        try:
            gather(value, shape, content)
        except UncountableContent as error:
            raise UncountableContent(error.message, param=key) from None
    return content


def gather(value: Any, shape: BodyShape, content: PromptContent) -> None:
    """Add ``value``'s strings, numbers and binary parts to ``content``, at any depth."""
    plain = _read(value, shape, content)
    if plain:
        _read(plain, PLAIN_JSON, content)


def _read(value: Any, shape: BodyShape, content: PromptContent) -> list[Any]:
    """Gather ``value`` by ``shape``'s rules; return what lies in its free-form fields."""
    media, kind_of, free_form = shape.media, shape.kind_of, shape.free_form
    texts = content.texts
    # A stack, not recursion: how deep a body nests is the caller's choice.
    pending, plain = [value], []
    while pending:
        value = pending.pop()
        kind = type(value)
        if kind is str:
            texts.append(value)
        elif kind is list:
            pending += value
        elif kind is dict:
            if not counted_as_media(value, media, content, kind_of):
                texts += value
                if free_form.isdisjoint(value):
                    pending += value.values()
                else:
                    for key, item in value.items():
                        (plain if key in free_form else pending).append(item)
            elif (field := kind_of(value)) in value:
                # Only the field its rule counted is binary: the rest is read as any other.
                texts += (key for key in value if key != field)
                pending += (item for key, item in value.items() if key != field)
        elif kind is int or kind is float:
            texts.append(repr(value))
    return plain


def counted_as_media(
    block: dict[str, Any],
    media: Mapping[str, MediaRule],
    content: PromptContent,
    kind_of: KindOf = typed,
) -> bool:
    """Count ``block`` by its kind's rule, if it has one that takes it; say whether it did."""
    kind = kind_of(block)
    rule = media.get(kind) if type(kind) is str else None
    counted = rule(block) if rule is not None else None
    if counted is None:
        return False
    setattr(content, counted, getattr(content, counted) + 1)
    return True
