"""GET /v1/models and GET /v1/models/{id}."""

from __future__ import annotations

from flask import Blueprint, Response, g

from app.auth.decorators import require_api_key
from app.catalog.errors import ModelNotFound
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


@bp.get("/models/<path:model_id>")
@require_api_key
def retrieve_model(model_id: str) -> Response:
    """Return one model's entry of the list; 404 if it is not served to the caller's key."""
    model = current_catalog().models.get(model_id)
    if model is None or not g.caller.may_use(model.id):
        raise ModelNotFound(model_id)
    return Response(dumps(model.to_dict()), mimetype="application/json")
