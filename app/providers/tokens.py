"""Count tokens where an upstream does not: to price a hold, and to bill a cut-off answer.

The encodings are bpe-openai's (tiktoken-compatible, its tables ship with the package, so
counting works offline). An upstream or a model may name its encoding in the catalog
(``tokenizer = "o200k_base"``); the default, cl100k_base, counts Llama 3 and most open
models' text at or above their own tokenizers. Prompt counts err on the high side: they
price the credit held before a request runs, and a hold that is too small is worse than
one that is too large.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

from app.providers.base import ChatRequest, PromptContent

if TYPE_CHECKING:
    import bpe_openai

# The encodings whose tables ship with bpe-openai. It lists others (gpt2, p50k_base, ...)
# whose tables tiktoken would download at first use: not here, where counting is offline.
ENCODINGS = ("cl100k_base", "o200k_base")
DEFAULT_ENCODING = "cl100k_base"
# The encoder refuses texts of a million characters and more than 200k tokens a call;
# slices this long stay far below both, even at several tokens a character.
SLICE_CHARACTERS = 32_768
MESSAGE_OVERHEAD_TOKENS = 4
TOOL_CALL_OVERHEAD_TOKENS = 8
REPLY_OVERHEAD_TOKENS = 3
LOW_DETAIL_IMAGE_TOKENS = 85
# A large image costs 765 tokens at OpenAI's high detail and up to about 1,600 at
# Anthropic's; an upstream with bigger images can say so with ``image_tokens``.
DEFAULT_IMAGE_TOKENS = 1_600


def encoding_names() -> list[str]:
    """Return the names of the encodings a catalog may name."""
    return list(ENCODINGS)


@functools.cache
def encoding_named(name: str) -> bpe_openai.Encoding:
    """Load the encoding ``name`` once per process."""
    return _bpe_openai().get_encoding(name)


def _bpe_openai() -> ModuleType:
    # Imported on first use: the import decodes every vocabulary the package ships (about
    # a second and 70 MB), which a catalog of built-in models alone should not pay for.
    import bpe_openai

    return bpe_openai


def count_text(text: str, encoding: bpe_openai.Encoding, *, limit: int | None = None) -> int:
    """Count the tokens of ``text``, special-token lookalikes counted as plain text.

    A long text is counted a slice at a time, yielding to the worker's other requests
    between slices (``time.sleep`` is gevent's in a worker); with ``limit`` the count
    stops as soon as it passes it, and returns a number above it.
    """
    if len(text) <= SLICE_CHARACTERS:
        return len(encoding.encode_ordinary(text)) if text else 0
    tokens = 0
    for start in range(0, len(text), SLICE_CHARACTERS):
        tokens += len(encoding.encode_ordinary(text[start : start + SLICE_CHARACTERS]))
        if limit is not None and tokens > limit:
            break
        time.sleep(0)
    return tokens


def count_json(value: Any, encoding: bpe_openai.Encoding) -> int:
    """Count the tokens of ``value`` written as compact JSON."""
    return count_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False), encoding)


def count_message(
    message: dict[str, Any],
    encoding: bpe_openai.Encoding,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
    limit: int | None = None,
) -> int:
    """Count one message: overhead, name, text parts, images, tool calls and call id.

    With ``limit``, counting stops once the count passes it (the result is then above it).
    """
    tokens = MESSAGE_OVERHEAD_TOKENS
    for kind, piece in message_pieces(message):
        if kind == "image":
            tokens += _image_tokens(piece, image_tokens, low_detail_image_tokens)
            continue
        if kind == "tool_call":
            tokens += TOOL_CALL_OVERHEAD_TOKENS
        remaining = None if limit is None else limit - tokens
        tokens += count_text(piece, encoding, limit=remaining)
        if limit is not None and tokens > limit:
            break
    return tokens


def message_pieces(message: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Yield ("text", str) for every text a message carries, ("image", part) per image."""
    for text in (message.get("name"), message.get("tool_call_id")):
        if text:
            yield "text", text
    content = message.get("content")
    if isinstance(content, str):
        yield "text", content
    else:
        for part in content or ():
            if part.get("type") == "text":
                yield "text", part.get("text") or ""
            else:
                yield "image", part
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        yield "tool_call", function.get("name") or ""
        yield "text", function.get("arguments") or ""


def _image_tokens(part: dict[str, Any], image_tokens: int, low_detail: int | None) -> int:
    if (part.get("image_url") or {}).get("detail") == "low" and low_detail is not None:
        return min(low_detail, image_tokens)
    return image_tokens


def count_part(
    part: dict[str, Any],
    encoding: bpe_openai.Encoding,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
) -> int:
    """Count a content part: its text, or a flat price per image (never its bytes).

    ``low_detail_image_tokens`` is what a ``detail: low`` image costs where the upstream
    honours ``detail``; None where it does not, and every image costs ``image_tokens``.
    """
    if part.get("type") == "text":
        return count_text(part.get("text") or "", encoding)
    return _image_tokens(part, image_tokens, low_detail_image_tokens)


def estimate_prompt_tokens(
    request: ChatRequest,
    encoding: bpe_openai.Encoding,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
    limit: int | None = None,
) -> int:
    """Estimate the prompt tokens of ``request``, erring high: messages, tools, schema.

    With ``limit``, counting stops once the count passes it (the result is then above it).
    """
    tokens = REPLY_OVERHEAD_TOKENS
    for message in request.messages:
        tokens += count_message(
            message,
            encoding,
            image_tokens=image_tokens,
            low_detail_image_tokens=low_detail_image_tokens,
            limit=None if limit is None else limit - tokens,
        )
        if limit is not None and tokens > limit:
            return tokens
    params = request.params
    if params.get("tools"):
        tokens += count_json(params["tools"], encoding)
    response_format = params.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        tokens += count_json(response_format.get("json_schema") or {}, encoding)
    return tokens


def prompt_token_bound(
    request: ChatRequest,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
) -> int:
    """Return an upper bound of the prompt tokens of ``request``, without tokenizing it.

    Every token of a byte-level BPE (and of the built-in model) is at least one byte, so
    a text has no more tokens than UTF-8 bytes; the fixed overheads and image prices are
    those the exact count adds. Declarations (tools, a response schema) are measured as
    spaced JSON, which is never shorter than the compact JSON that is counted.
    """
    tokens = REPLY_OVERHEAD_TOKENS
    for message in request.messages:
        tokens += MESSAGE_OVERHEAD_TOKENS
        for kind, piece in message_pieces(message):
            if kind == "image":
                tokens += _image_tokens(piece, image_tokens, low_detail_image_tokens)
            else:
                tokens += utf8_size(str(piece))
                tokens += TOOL_CALL_OVERHEAD_TOKENS if kind == "tool_call" else 0
    params = request.params
    if params.get("tools"):
        tokens += utf8_size(json.dumps(params["tools"], ensure_ascii=False))
    response_format = params.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        tokens += utf8_size(
            json.dumps(response_format.get("json_schema") or {}, ensure_ascii=False)
        )
    return tokens


def content_image_tokens(
    content: PromptContent, *, image_tokens: int, low_detail_image_tokens: int | None
) -> int:
    """Return what the images of ``content`` cost, at a flat price each (never their bytes)."""
    low = image_tokens
    if low_detail_image_tokens is not None:
        low = min(low_detail_image_tokens, image_tokens)
    return content.images * image_tokens + content.low_detail_images * low


def count_content(
    content: PromptContent,
    encoding: bpe_openai.Encoding,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
    limit: int | None = None,
) -> int:
    """Count the tokens of ``content``'s texts, each alone, and its images.

    With ``limit``, counting stops once the count passes it (the result is then above it).
    """
    tokens = content_image_tokens(
        content, image_tokens=image_tokens, low_detail_image_tokens=low_detail_image_tokens
    )
    for text in content.texts:
        tokens += count_text(text, encoding, limit=None if limit is None else limit - tokens)
        if limit is not None and tokens > limit:
            break
    return tokens


def content_token_bound(
    content: PromptContent,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
) -> int:
    """Return an upper bound of ``count_content``, without tokenizing: the texts' UTF-8 size."""
    images = 0
    if content.images or content.low_detail_images:
        images = content_image_tokens(
            content, image_tokens=image_tokens, low_detail_image_tokens=low_detail_image_tokens
        )
    # One string's size, not each text's: the sizes add up, and it is one call.
    return images + utf8_size("".join(content.texts))


def utf8_size(text: str) -> int:
    """Return the length of ``text`` in UTF-8 bytes."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
