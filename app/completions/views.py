"""POST /v1/chat/completions."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, request

from app.auth.decorators import require_api_key
from app.catalog.registry import current_catalog
from app.completions.decorators import honour_idempotency_key
from app.completions.generations import run_completion, start_generation, stream_generation
from app.completions.schemas import parse_chat_request
from app.completions.sse import event_stream_response
from app.encoding import dumps
from app.request_body import json_body

bp = Blueprint("completions", __name__)


@bp.post("/chat/completions")
@require_api_key
@honour_idempotency_key
def create_chat_completion() -> Response:
    """Generate a chat completion, whole or streamed, paid from the caller's credits."""
    chat_request = parse_chat_request(json_body(request))
    model = current_catalog().resolve(chat_request.model, may_use=g.caller.may_use)
    generation = start_generation(
        caller=g.caller,
        model=model,
        request=chat_request,
        hold_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
    )
    if chat_request.stream:
        return event_stream_response(stream_generation(generation))
    return Response(dumps(run_completion(generation)), mimetype="application/json")
