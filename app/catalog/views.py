"""GET /v1/models."""

from __future__ import annotations

from flask import Blueprint, Response, g

from app.auth.decorators import require_api_key
from app.catalog.registry import current_catalog
from app.encoding import dumps

bp = Blueprint("catalog", __name__)


@bp.get("/models")
@require_api_key
def list_models() -> Response:
    """List the models the caller's key may use, with prices (USD per million) and capabilities."""
    models = current_catalog().list(may_use=g.caller.may_use)
    body = {"object": "list", "data": [model.to_dict() for model in models]}
    return Response(dumps(body), mimetype="application/json")
