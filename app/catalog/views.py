"""GET /v1/models and GET /v1/models/{id}, in OpenAI's shape or, for other doors' clients, theirs.

A request that carries ``anthropic-version`` (the Anthropic SDKs and Claude Code send it
on every call) is answered with Anthropic's model objects and list page, so that their
model pickers work; a request another door claims (``register_model_shape``: Google's
clients, by their key's header) in that door's shape; every other with OpenAI's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Flask, Request, Response, current_app, g, request

from app.auth.decorators import require_api_key
from app.catalog.errors import ModelNotFound
from app.catalog.registry import CHAT_MODEL, Model, current_catalog
from app.encoding import dumps
from app.errors import InvalidRequest

bp = Blueprint("catalog", __name__)

ANTHROPIC_VERSION = "anthropic-version"
DEFAULT_PAGE, MAX_PAGE = 20, 1000
MODEL_SHAPES = "gateway.model_shapes"


@dataclass(frozen=True)
class ModelShape:
    """A door's rendering of the model list and of one model, for the requests it claims."""

    claims: Callable[[], bool]
    page: Callable[[list[Model]], dict[str, Any]]
    one: Callable[[Model], dict[str, Any]]


def register_model_shape(app: Flask, shape: ModelShape) -> None:
    """Answer the model list and its models in ``shape`` for the requests it claims."""
    app.extensions.setdefault(MODEL_SHAPES, []).append(shape)


def claiming_shape() -> ModelShape | None:
    """Return the shape registered by a door that claims the request, if one does."""
    for shape in current_app.extensions.get(MODEL_SHAPES, ()):
        if shape.claims():
            return shape
    return None


@bp.get("/models")
@require_api_key
def list_models() -> Response:
    """List the models the caller's key may use, with prices (USD per million) and capabilities."""
    models = current_catalog().list(may_use=g.caller.may_use)
    if (shape := claiming_shape()) is not None:
        body = shape.page(models)
    elif ANTHROPIC_VERSION in request.headers:
        # Anthropic's clients pick chat models from it: embedding models are not theirs.
        body = anthropic_page([model for model in models if model.type == CHAT_MODEL], request)
    else:
        body = {"object": "list", "data": [model.to_dict() for model in models]}
    return Response(dumps(body), mimetype="application/json")


@bp.get("/models/<path:model_id>")
@require_api_key
def retrieve_model(model_id: str) -> Response:
    """Return one model's entry of the list; 404 if it is not served to the caller's key."""
    shape = claiming_shape()
    if shape is not None:
        # Google's clients name a model ``models/ID``.
        model_id = model_id.removeprefix("models/")
    model = current_catalog().named(model_id)
    if model is None or not g.caller.may_use(model.id):
        raise ModelNotFound(model_id)
    if shape is not None:
        return Response(dumps(shape.one(model)), mimetype="application/json")
    if ANTHROPIC_VERSION in request.headers:
        return Response(dumps(anthropic_model(model)), mimetype="application/json")
    return Response(dumps(model.to_dict()), mimetype="application/json")


def anthropic_model(model: Model) -> dict[str, Any]:
    """Render a model as Anthropic's ModelInfo (the catalog names no display name: its id)."""
    created = datetime.fromtimestamp(model.created, UTC).isoformat().replace("+00:00", "Z")
    return {"type": "model", "id": model.id, "display_name": model.id, "created_at": created}


def anthropic_page(models: list[Model], page_request: Request) -> dict[str, Any]:
    """Render a page of Anthropic's model list: ``limit`` models after or before an id."""
    ids = [model.id for model in models]
    start, end = 0, len(models)
    if after := page_request.args.get("after_id"):
        start = ids.index(after) + 1 if after in ids else end
    if before := page_request.args.get("before_id"):
        end = ids.index(before) if before in ids else 0
    limit = page_limit(page_request.args.get("limit"))
    window = models[start:end]
    page = window[-limit:] if before and not after else window[:limit]
    data = [anthropic_model(model) for model in page]
    return {
        "data": data,
        "has_more": len(page) < len(window),
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def page_limit(value: str | None) -> int:
    """Read ``limit``: 1 to 1000, 20 when absent."""
    if value is None:
        return DEFAULT_PAGE
    # str.isdigit takes any script's digits (and ², which int() refuses).
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PAGE:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_PAGE}.", param="limit")
    return int(value)
