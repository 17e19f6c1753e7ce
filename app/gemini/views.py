"""POST /v1beta/models/{model}:generateContent, its stream, :countTokens, embeddings; the models.

Mounted under /v1beta, as Google's clients call by default, and its POST paths under /v1
too (GET /v1/models is shared with the other doors: the catalog answers Google's clients
there in Google's shape). A model is named as the path says it, ``models/`` and all.
"""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, request
from flask.blueprints import BlueprintSetupState
from werkzeug.routing import PathConverter

from app.auth.decorators import require_api_key
from app.catalog.errors import ModelNotFound
from app.catalog.pricing import NO_SURCHARGES
from app.catalog.registry import Model, current_catalog
from app.catalog.views import ModelShape
from app.encoding import dumps
from app.errors import InvalidRequest
from app.gemini.bodies import GEMINI_FRAMING, model_body
from app.gemini.embeddings import EMBEDDING_METHODS, embed
from app.gemini.errors import from_google_client
from app.gemini.native import (
    RelayedStream,
    answered,
    counted_body,
    native_call,
    passed_request,
    prompt_of,
    surcharges_of,
    whole_outcome,
)
from app.gemini.schemas import GeminiRequest, parse_count_tokens_request, parse_generate_request
from app.gemini.translation import StreamTranslation, chat_request, response_of, thoughts_shown
from app.generations.decorators import claimed_generation_id, honour_idempotency_key
from app.generations.lifecycle import (
    Generation,
    count_prompt_tokens,
    native_routes,
    new_embedding_id,
    new_generation_id,
    relay_generation,
    relay_stream,
    run_generation,
    start_generation,
    stream_generation,
)
from app.generations.metering import DeliveryMeter
from app.generations.models import GEMINI
from app.generations.prompts import TranslatedPrompt
from app.generations.refusals import output_field_named
from app.request_body import json_body
from app.sse import event_stream_response

bp = Blueprint("gemini", __name__)
# The same calls under /v1, where GET /models is the catalog's: it answers Google's
# clients in this door's shape (MODEL_SHAPE).
bp_v1 = Blueprint("gemini_v1", __name__)
MODEL_PREFIX = "models/"


class ModelCallConverter(PathConverter):
    """A path that names a model and a method: ``{model}:{method}`` (the model may hold /)."""

    regex = r"[^/].*:[^/:]*"


class ModelNameConverter(PathConverter):
    """A path that names a model alone: no ``:method`` (GET answers models, POST calls them)."""

    regex = r"[^/:][^:]*"


def add_converters(state: BlueprintSetupState) -> None:
    """Teach the app the converters of this door's paths, once."""
    state.app.url_map.converters.setdefault("model_call", ModelCallConverter)
    state.app.url_map.converters.setdefault("model_name", ModelNameConverter)


bp.record_once(add_converters)
bp_v1.record_once(add_converters)
METHODS = ("generateContent", "streamGenerateContent", "countTokens", *EMBEDDING_METHODS)
PAGE_SIZE, MAX_PAGE_SIZE = 50, 1000


def model_id(name: str) -> str:
    """Return the model a path names: ``models/ID`` or ``ID`` alike."""
    return name.removeprefix(MODEL_PREFIX)


def call_model(target: str) -> Response:
    """Answer ``{model}:{method}``: a generation, its stream, a count of its prompt, vectors."""
    name, _, method = target.rpartition(":")
    if not name or method not in METHODS:
        raise InvalidRequest(
            f"The path names no method this API serves: {target!r}; it takes "
            "models/{model}:generateContent, :streamGenerateContent, :countTokens, "
            ":embedContent or :batchEmbedContents.",
            param="model",
        )
    body = json_body()
    if method in EMBEDDING_METHODS:
        return embed(model_id(name), method, body)
    if method == "countTokens":
        return count_tokens(model_id(name), body)
    return generate_content(model_id(name), body, stream=method == "streamGenerateContent")


def generate_content(name: str, body: dict, *, stream: bool) -> Response:
    """Answer a generateContent request, whole or streamed, paid from the caller's credits.

    On a model whose routes say ``api = "gemini"`` it is passed through (app.gemini.native).
    """
    gemini_request = parse_generate_request(body, name, stream=stream)
    model = current_catalog().resolve(name, may_use=g.caller.may_use)
    passed_through = bool(native_routes(model, GEMINI))
    with output_field_named("generationConfig.maxOutputTokens"):
        generation = start_generation(
            caller=g.caller,
            model=model,
            request=passed_request(gemini_request, model)
            if passed_through
            else model.with_defaults(chat_request(gemini_request, model)),
            hold_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
            generation_id=claimed_generation_id() or new_generation_id(),
            api=GEMINI,
            # A translated route is sent none of Google's hosted tools: nothing to bill.
            surcharges=surcharges_of(body) if passed_through else NO_SURCHARGES,
            prompt=prompt_of(body, model) if passed_through else None,
        )
    if passed_through:
        return relayed_content(generation, body, stream=stream)
    thoughts = thoughts_shown(gemini_request)
    if stream:
        translation = StreamTranslation(generation, thoughts=thoughts)
        events = translation.events(stream_generation(generation))
        return event_stream_response(events, GEMINI_FRAMING)
    answer = response_of(generation, run_generation(generation), thoughts=thoughts)
    return Response(dumps(answer), mimetype="application/json")


def relayed_content(generation: Generation, body: dict, *, stream: bool) -> Response:
    """Answer a request passed through to an upstream that serves Google's Gemini API."""
    call = native_call(body, generation, stream=stream)
    if stream:
        relayed = RelayedStream(generation)
        events = relayed.events(relay_stream(generation, call, relayed))
        return event_stream_response(events, relayed.framing())
    answer, usage, cost = relay_generation(
        generation, call, whole_outcome(DeliveryMeter(generation))
    )
    return Response(
        dumps(answered(answer.decoded, generation, cost, usage)), mimetype="application/json"
    )


def count_tokens(name: str, body: object) -> Response:
    """Count a prompt's tokens as a hold on its model does; free, nothing is held or recorded.

    On a model whose requests are passed through, that is the body as it would be sent.
    """
    gemini_request: GeminiRequest = parse_count_tokens_request(body, name)
    model = current_catalog().resolve(name, may_use=g.caller.may_use)
    if native_routes(model, GEMINI):
        prompt = prompt_of(counted_body(body), model)
    else:
        prompt = TranslatedPrompt(chat_request(gemini_request, model), model.routes[0])
    tokens = count_prompt_tokens(model=model, prompt=prompt)
    return Response(dumps({"totalTokens": tokens}), mimetype="application/json")


@bp.post("/models/<model_call:target>")
@bp_v1.post("/models/<model_call:target>")
@require_api_key
@honour_idempotency_key(lambda: new_call_id(request.view_args["target"]))
def model_call(target: str) -> Response:
    """Route ``POST /models/{model}:{method}``."""
    return call_model(target)


def new_call_id(target: str) -> str:
    """Return the id of a new generation for ``{model}:{method}``: an embedding's or a chat's."""
    if target.rpartition(":")[2] in EMBEDDING_METHODS:
        return new_embedding_id()
    return new_generation_id()


@bp.get("/models")
@require_api_key
def list_models() -> Response:
    """List the models the caller's key may use, as Google's Model objects, a page at a time."""
    models = current_catalog().list(may_use=g.caller.may_use)
    return Response(dumps(models_page(models)), mimetype="application/json")


@bp.get("/models/<model_name:name>")
@require_api_key
def get_model(name: str) -> Response:
    """Return one model; 404 if it is not served to the caller's key."""
    return Response(dumps(one_model(name)), mimetype="application/json")


def models_page(models: list[Model]) -> dict[str, object]:
    """Return a page of ``models``: ``pageSize`` of them after ``pageToken``."""
    size = page_size(request.args.get("pageSize") or request.args.get("page_size"))
    token = request.args.get("pageToken") or request.args.get("page_token") or ""
    start = int(token) if token.isascii() and token.isdigit() else 0
    body: dict[str, object] = {"models": [model_body(m) for m in models[start : start + size]]}
    if start + size < len(models):
        body["nextPageToken"] = str(start + size)
    return body


def one_model(name: str) -> dict[str, object]:
    """Return Google's Model of ``name`` (``models/ID`` or ``ID``) served to the caller."""
    model = current_catalog().models.get(model_id(name))
    if model is None or not g.caller.may_use(model.id):
        raise ModelNotFound(model_id(name))
    return model_body(model)


def page_size(value: str | None) -> int:
    """Read ``pageSize``: 1 to 1000, 50 when absent."""
    if value is None:
        return PAGE_SIZE
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PAGE_SIZE:
        raise InvalidRequest(
            f"pageSize must be an integer from 1 to {MAX_PAGE_SIZE}.", param="pageSize"
        )
    return int(value)


MODEL_SHAPE = ModelShape(claims=from_google_client, page=models_page, one=model_body)
