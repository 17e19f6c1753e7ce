"""A caller's own generation records, as GET /v1/generations/{id} shows them."""

from __future__ import annotations

from typing import Any

from app.extensions import db
from app.generations.errors import GenerationNotFound
from app.generations.models import Generation


def find_generation_or_raise(*, account_id: int, generation_id: str) -> Generation:
    """Return the account's generation ``generation_id``.

    :raise GenerationNotFound: there is none, or it is another account's (the same 404,
        so that ids of other accounts cannot be probed).
    """
    generation = db.session.get(Generation, generation_id) if len(generation_id) <= 64 else None
    db.session.commit()
    if generation is None or generation.account_id != account_id:
        raise GenerationNotFound(f"No generation with id '{generation_id[:64]}'.", param="id")
    return generation


def generation_body(generation: Generation) -> dict[str, Any]:
    """Render a generation record: tokens by kind, cost, timings and the upstreams tried."""
    return {
        "id": generation.id,
        "model": generation.model,
        "created_at": generation.created_at.isoformat(),
        "request_id": generation.request_id,
        "status": generation.status,
        "finish_reason": generation.finish_reason,
        "streamed": generation.streamed,
        "estimated": generation.estimated,
        "usage": {
            "prompt_tokens": generation.prompt_tokens,
            "completion_tokens": generation.completion_tokens,
            "total_tokens": generation.prompt_tokens + generation.completion_tokens,
            "cached_tokens": generation.cached_tokens,
            "prompt_image_tokens": generation.prompt_image_tokens,
            "reasoning_tokens": generation.reasoning_tokens,
        },
        "total_cost": generation.cost,
        "latency_ms": generation.latency_ms,
        "time_to_first_token_ms": generation.time_to_first_token_ms,
        "upstreams": generation.upstream_attempts or [],
    }
