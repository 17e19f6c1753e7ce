"""GET /v1/models and GET /v1/models/{id}."""

from __future__ import annotations

from flask import Blueprint, Response, g

from app.auth.decorators import require_api_key
from app.auth.keys import Caller
from app.auth.models import ACTIVE
from app.catalog.errors import ModelNotFound
from app.catalog.registry import Model, current_catalog
from app.encoding import dumps

bp = Blueprint("catalog", __name__)


def visible_to(caller: Caller, model: Model) -> bool:
    """Whether ``caller`` may see and use ``model``: any active key may use every served model."""
    return caller.state == ACTIVE


@bp.get("/models")
@require_api_key
def list_models() -> Response:
    """List the served models, with their prices (USD per million tokens) and capabilities."""
    models = [model.to_dict() for model in current_catalog().list() if visible_to(g.caller, model)]
    return Response(dumps({"object": "list", "data": models}), mimetype="application/json")


@bp.get("/models/<path:model_id>")
@require_api_key
def retrieve_model(model_id: str) -> Response:
    """Return one model's entry of the list; 404 if it is not served to the caller."""
    model = current_catalog().models.get(model_id)
    if model is None or not visible_to(g.caller, model):
        raise ModelNotFound(model_id)
    return Response(dumps(model.to_dict()), mimetype="application/json")
