"""POST /v1/embeddings."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g

from app.auth.decorators import require_api_key
from app.catalog.registry import EMBEDDING_MODEL, current_catalog
from app.embeddings.bodies import embeddings_body
from app.embeddings.schemas import parse_embedding_request
from app.encoding import dumps_transient
from app.generations.decorators import claimed_generation_id, honour_idempotency_key
from app.generations.lifecycle import new_embedding_id, run_embeddings, start_embeddings
from app.generations.models import EMBEDDINGS
from app.generations.refusals import check_dimensions, inputs_within_context
from app.providers.errors import UpstreamError
from app.providers.vectors import UnreadableVector
from app.request_body import json_body

bp = Blueprint("embeddings", __name__)


@bp.post("/embeddings")
@require_api_key
@honour_idempotency_key(new_embedding_id)
def create_embeddings() -> Response:
    """Embed the inputs, paid from the caller's credits at the upstream's prompt tokens."""
    parsed = parse_embedding_request(json_body())
    embedding_request = parsed.request
    model = current_catalog().resolve(
        embedding_request.model, may_use=g.caller.may_use, model_type=EMBEDDING_MODEL
    )
    check_dimensions(embedding_request, model)
    inputs_within_context(embedding_request, model)
    generation = start_embeddings(
        g.caller,
        model,
        embedding_request,
        api=EMBEDDINGS,
        hold_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
        generation_id=claimed_generation_id() or new_embedding_id(),
    )
    embeddings, cost = run_embeddings(generation, embedding_request)
    try:
        body = embeddings_body(
            embeddings, model_id=model.id, encoding_format=parsed.encoding_format, cost=cost
        )
    except UnreadableVector:
        # Settled already, at the usage the upstream reported: it answered, and billed.
        raise UpstreamError(
            "The model's upstream answered a vector the gateway cannot read."
        ) from None
    # Sent once and dropped: the copy dumps() makes for long-lived bytes would be a
    # second pass over every vector.
    return Response(dumps_transient(body), mimetype="application/json")
