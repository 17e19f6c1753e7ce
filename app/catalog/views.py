"""GET /v1/models."""

from __future__ import annotations

from flask import Blueprint, Response

from app.auth.decorators import require_api_key
from app.catalog.registry import current_catalog
from app.encoding import dumps

bp = Blueprint("catalog", __name__)


@bp.get("/models")
@require_api_key
def list_models() -> Response:
    """List the served models, with their prices (USD per million tokens) and capabilities."""
    body = {"object": "list", "data": [model.to_dict() for model in current_catalog().list()]}
    return Response(dumps(body), mimetype="application/json")
