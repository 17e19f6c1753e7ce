"""Google's wire format of an answer: a GenerateContentResponse, its usage, its stream, models.

Only the encoding lives here, from values already in Google's terms (parts, a finish
reason, token counts); how the core's normalized results become those is
``translation``'s.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.catalog.registry import EMBEDDING_MODEL, Model
from app.gemini.errors import error_body
from app.providers.base import Usage
from app.sse import Framing, data_event

# One GenerateContentResponse per ``data:`` event; a stream broken by an error ends with
# an event holding Google's error envelope, which the SDKs raise; nothing marks the end.
GEMINI_FRAMING = Framing(frame=data_event, error=lambda error: data_event(error_body(error)))
# What every model of the gateway can be asked for through this door.
GENERATION_METHODS = ["generateContent", "streamGenerateContent", "countTokens"]
# What an embedding model can be asked for instead.
EMBEDDING_METHODS = ["embedContent", "batchEmbedContents"]


def usage_metadata(usage: Usage, cost: Decimal | None = None) -> dict[str, Any]:
    """Render a usage in Google's terms, with the cost charged (USD) when it is known.

    ``promptTokenCount`` includes the cached tokens, as the normalized ``prompt_tokens``
    does; ``candidatesTokenCount`` leaves out the thoughts, which Google counts apart.
    """
    body: dict[str, Any] = {
        "promptTokenCount": usage.prompt_tokens,
        "candidatesTokenCount": max(usage.completion_tokens - usage.reasoning_tokens, 0),
        "totalTokenCount": usage.prompt_tokens + usage.completion_tokens,
    }
    if usage.cached_tokens:
        body["cachedContentTokenCount"] = usage.cached_tokens
    if usage.reasoning_tokens:
        body["thoughtsTokenCount"] = usage.reasoning_tokens
    if cost is not None:
        body["cost"] = {"totalCost": cost}
    return body


def candidate(
    parts: list[dict[str, Any]], finish_reason: str | None, index: int = 0
) -> dict[str, Any]:
    """Build a candidate: the model's turn, and why it ended (None while it goes on)."""
    body: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": index}
    if finish_reason is not None:
        body["finishReason"] = finish_reason
    return body


def response_body(
    *,
    response_id: str,
    model: str,
    candidates: list[dict[str, Any]],
    usage: dict[str, Any] | None,
) -> dict[str, Any]:
    """Build a GenerateContentResponse (a whole answer, or one event of a stream)."""
    body: dict[str, Any] = {"candidates": candidates}
    if usage is not None:
        body["usageMetadata"] = usage
    body["modelVersion"] = model
    body["responseId"] = response_id
    return body


def model_body(model: Model) -> dict[str, Any]:
    """Render a model as Google's Model (the catalog names no display name: its id).

    An embedding model answers one vector per input: its output limit is 1, as Google's are.
    """
    embedding = model.type == EMBEDDING_MODEL
    return {
        "name": f"models/{model.id}",
        "baseModelId": model.id,
        "version": "001",
        "displayName": model.id,
        "description": f"{model.id}, served by {model.owned_by}.",
        "inputTokenLimit": model.context_length,
        "outputTokenLimit": 1 if embedding else model.max_output_tokens,
        "supportedGenerationMethods": EMBEDDING_METHODS if embedding else GENERATION_METHODS,
        "thinking": "reasoning" in model.capabilities,
    }
