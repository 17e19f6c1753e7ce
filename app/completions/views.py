"""POST /v1/chat/completions."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g

from app.auth.decorators import require_api_key
from app.catalog.registry import current_catalog
from app.completions.bodies import CHAT_FRAMING, chunk_bodies, completion_body
from app.completions.schemas import parse_chat_request
from app.encoding import dumps
from app.generations.decorators import claimed_generation_id, honour_idempotency_key
from app.generations.lifecycle import (
    new_generation_id,
    run_generation,
    start_generation,
    stream_generation,
)
from app.generations.refusals import forwarded_surcharges, output_field_named
from app.request_body import json_body
from app.sse import event_stream_response

bp = Blueprint("completions", __name__)


@bp.post("/chat/completions")
@require_api_key
@honour_idempotency_key(new_generation_id)
def create_chat_completion() -> Response:
    """Generate a chat completion, whole or streamed, paid from the caller's credits."""
    caller = g.caller
    chat_request = parse_chat_request(json_body())
    model = current_catalog().resolve(chat_request.model, may_use=caller.may_use)
    chat_request = model.with_defaults(chat_request)
    # The caller's own name for the output cap: the alias they sent, else max_tokens.
    field = "max_completion_tokens" if "max_completion_tokens" in chat_request.params else None
    with output_field_named(field or "max_tokens"):
        generation = start_generation(
            caller=caller,
            model=model,
            request=chat_request,
            hold_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
            generation_id=claimed_generation_id(),
            surcharges=forwarded_surcharges(chat_request, model),
        )
    if chat_request.stream:
        chunks = chunk_bodies(generation, stream_generation(generation))
        return event_stream_response(chunks, CHAT_FRAMING)
    answer = run_generation(generation)
    return Response(dumps(completion_body(generation, answer)), mimetype="application/json")
