"""Chat Completions' wire format of a generation's answer, chunks and usage."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from app.generations.lifecycle import Answer, Generation, StreamEnd, StreamItem
from app.providers.base import Usage, fingerprint_of
from app.sse import Framing, data_event

# Chat Completions' events are data lines; an error after the first is one more, in the
# envelope's shape, and every stream ends with [DONE].
CHAT_FRAMING = Framing(
    frame=data_event,
    error=lambda error: data_event(error.to_envelope()),
    end=b"data: [DONE]\n\n",
)


def usage_body(usage: Usage, cost: Decimal) -> dict[str, Any]:
    """Render the contract's Usage, with the cost charged."""
    body = usage.to_dict()
    body["cost"] = {"total_cost": cost}
    return body


def completion_body(generation: Generation, answer: Answer) -> dict[str, Any]:
    """Build the ChatCompletionResponse."""
    completion = answer.completion
    return {
        "id": generation.id,
        "object": "chat.completion",
        "created": generation.created,
        "model": generation.model.id,
        "choices": completion.choices,
        "usage": usage_body(completion.usage, answer.cost),
        "system_fingerprint": completion.system_fingerprint or fingerprint_of(generation.model.id),
    }


def chunk_body(
    generation: Generation, choices: list[dict[str, Any]], system_fingerprint: str
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


def chunk_bodies(
    generation: Generation, items: Iterator[StreamItem]
) -> Iterator[dict[str, Any] | None]:
    """Yield the ChatCompletionChunks of a streamed generation; the Nones pass through.

    The last chunk carries the usage and its cost when the caller asked for it
    (``stream_options.include_usage``). Closing this closes the generation's stream.
    """
    fingerprint = fingerprint_of(generation.model.id)
    # Every chunk is a copy of this one with its own fingerprint and choices: the
    # generation's fields are read once a stream, not once a chunk.
    head = chunk_body(generation, [], fingerprint)
    try:
        for item in items:
            if item is None:
                yield None
            elif isinstance(item, StreamEnd):
                if generation.request.include_usage:
                    body = head.copy()
                    body["system_fingerprint"], body["choices"] = fingerprint, []
                    body["usage"] = usage_body(item.usage, item.cost)
                    yield body
            else:
                fingerprint = item.system_fingerprint or fingerprint
                body = head.copy()
                body["system_fingerprint"] = fingerprint
                body["choices"] = item.choices
                yield body
    finally:
        items.close()
