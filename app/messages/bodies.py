"""Anthropic's wire format of an answer: the Message, its usage, and its stream's events.

Only the encoding lives here, from values already in Anthropic's terms (content blocks,
a stop reason, token counts): how the core's normalized results become those is
``translation``'s, so that an answer passed through from an Anthropic upstream can be
framed by the same functions.
"""

from __future__ import annotations

import secrets
from decimal import Decimal
from typing import Any

from app.messages.errors import error_body
from app.providers.base import Usage
from app.sse import Framing, typed_event

# Every event is named by its type (the SDKs dispatch on the ``event:`` line); a stream
# broken by an error ends with an ``error`` event, and nothing follows ``message_stop``.
MESSAGES_FRAMING = Framing(
    frame=typed_event,
    error=lambda error: typed_event(error_body(error)),
    end=b"",
)
PING = {"type": "ping"}
MESSAGE_STOP = {"type": "message_stop"}


def usage_body(usage: Usage, cost: Decimal | None = None) -> dict[str, Any]:
    """Render a usage in Anthropic's terms, with the cost charged when it is known.

    Anthropic's ``input_tokens`` leaves out the prompt tokens read from or written to
    its cache, which the normalized ``prompt_tokens`` includes.
    """
    cached = usage.cached_tokens + usage.cache_write_tokens
    body: dict[str, Any] = {
        "input_tokens": max(usage.prompt_tokens - cached, 0),
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": usage.cache_write_tokens - usage.cache_write_1h_tokens,
            "ephemeral_1h_input_tokens": usage.cache_write_1h_tokens,
        },
        "output_tokens_details": {"thinking_tokens": usage.reasoning_tokens},
    }
    if cost is not None:
        body["cost"] = {"total_cost": cost}
    return body


def message_body(
    *,
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    usage: dict[str, Any],
    stop_sequence: str | None = None,
) -> dict[str, Any]:
    """Build a Message (a whole answer, or the one a stream starts with)."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def message_start(message: dict[str, Any]) -> dict[str, Any]:
    """Build the first event: the message, its content still empty."""
    return {"type": "message_start", "message": message}


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    """Open content block ``index``."""
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    """Add to content block ``index``."""
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int) -> dict[str, Any]:
    """Close content block ``index``."""
    return {"type": "content_block_stop", "index": index}


def message_delta(
    stop_reason: str | None, usage: dict[str, Any], stop_sequence: str | None = None
) -> dict[str, Any]:
    """Build the message's end: why it stopped, its whole usage (totals, not increments)."""
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
        "usage": usage,
    }


def new_message_id() -> str:
    """Return a fresh message id, as Anthropic names its answers."""
    return "msg_" + secrets.token_hex(12)


def new_tool_use_id() -> str:
    """Return a fresh tool use id, for a call its upstream sent without one."""
    return "toolu_" + secrets.token_hex(12)
