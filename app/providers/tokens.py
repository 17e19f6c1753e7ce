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
from types import ModuleType
from typing import TYPE_CHECKING, Any

from app.providers.base import ChatRequest

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


def count_text(text: str, encoding: bpe_openai.Encoding) -> int:
    """Count the tokens of ``text``, special-token lookalikes counted as plain text."""
    if len(text) <= SLICE_CHARACTERS:
        return len(encoding.encode_ordinary(text)) if text else 0
    return sum(
        len(encoding.encode_ordinary(text[start : start + SLICE_CHARACTERS]))
        for start in range(0, len(text), SLICE_CHARACTERS)
    )


def count_json(value: Any, encoding: bpe_openai.Encoding) -> int:
    """Count the tokens of ``value`` written as compact JSON."""
    return count_text(json.dumps(value, separators=(",", ":"), ensure_ascii=False), encoding)


def count_message(
    message: dict[str, Any],
    encoding: bpe_openai.Encoding,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
) -> int:
    """Count one message: overhead, name, text parts, images, tool calls and call id."""
    tokens = MESSAGE_OVERHEAD_TOKENS
    for text in (message.get("name"), message.get("tool_call_id")):
        if text:
            tokens += count_text(text, encoding)
    content = message.get("content")
    if isinstance(content, str):
        tokens += count_text(content, encoding)
    else:
        tokens += sum(
            count_part(
                part,
                encoding,
                image_tokens=image_tokens,
                low_detail_image_tokens=low_detail_image_tokens,
            )
            for part in content or ()
        )
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        tokens += TOOL_CALL_OVERHEAD_TOKENS + count_text(function.get("name") or "", encoding)
        tokens += count_text(function.get("arguments") or "", encoding)
    return tokens


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
    low_detail = (part.get("image_url") or {}).get("detail") == "low"
    if low_detail and low_detail_image_tokens is not None:
        return min(low_detail_image_tokens, image_tokens)
    return image_tokens


def estimate_prompt_tokens(
    request: ChatRequest,
    encoding: bpe_openai.Encoding,
    *,
    image_tokens: int,
    low_detail_image_tokens: int | None = LOW_DETAIL_IMAGE_TOKENS,
) -> int:
    """Estimate the prompt tokens of ``request``, erring high: messages, tools, schema."""
    tokens = REPLY_OVERHEAD_TOKENS + sum(
        count_message(
            message,
            encoding,
            image_tokens=image_tokens,
            low_detail_image_tokens=low_detail_image_tokens,
        )
        for message in request.messages
    )
    params = request.params
    if params.get("tools"):
        tokens += count_json(params["tools"], encoding)
    response_format = params.get("response_format") or {}
    if response_format.get("type") == "json_schema":
        tokens += count_json(response_format.get("json_schema") or {}, encoding)
    return tokens
