"""POST /v1/responses, and GET and DELETE of stored responses and their input items."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, g, request

from app.auth.decorators import require_api_key
from app.catalog.registry import current_catalog
from app.encoding import dumps, loads
from app.errors import InvalidRequest
from app.generations.decorators import claimed_generation_id, honour_idempotency_key
from app.generations.lifecycle import (
    Generation,
    native_routes,
    relay_generation,
    relay_stream,
    run_generation,
    start_generation,
    stream_generation,
)
from app.generations.models import RESPONSES
from app.generations.prompts import sent_prompt
from app.generations.refusals import output_field_named
from app.request_body import json_body
from app.responses.bodies import EventWriter
from app.responses.conversation import Turn
from app.responses.errors import ResponseNotFound
from app.responses.ids import new_response_id
from app.responses.models import StoredResponse
from app.responses.native import (
    SENT_BODY,
    RelayedStream,
    answered_whole,
    forwarded_body,
    native_call,
    passed_request,
    sent_items,
    surcharges_of,
    whole_outcome,
)
from app.responses.schemas import parse_response_request
from app.responses.store import delete_response, find_stored
from app.responses.translation import StreamTranslation, check_output_limit, response_events
from app.sse import event_stream_response

bp = Blueprint("responses", __name__)

MAX_PAGE, DEFAULT_PAGE = 100, 20


@bp.post("/responses")
@require_api_key
@honour_idempotency_key(new_response_id)
def create_response() -> Response:
    """Answer a Responses API request, whole or streamed, paid from the caller's credits."""
    body = json_body()
    response_request = parse_response_request(body)
    model = current_catalog().resolve(response_request.model, may_use=g.caller.may_use)
    check_output_limit(response_request, model)
    passed_through = bool(native_routes(model, RESPONSES))
    turn = Turn(
        response_request,
        account_id=g.caller.account_id,
        response_id=claimed_generation_id() or new_response_id(),
        ttl_days=current_app.config["RESPONSES_TTL_DAYS"],
        sent=sent_items(body, response_request) if passed_through else None,
    )
    forwarded = forwarded_body(turn, body) if passed_through else None
    with output_field_named("max_output_tokens"):
        generation = start_generation(
            caller=g.caller,
            model=model,
            request=passed_request(response_request)
            if forwarded is not None
            else model.with_defaults(turn.chat_request()),
            hold_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
            generation_id=turn.draft.id,
            api=RESPONSES,
            surcharges=surcharges_of(body, passed_through=passed_through),
            prompt=sent_prompt(forwarded, SENT_BODY, model) if forwarded is not None else None,
        )
    if forwarded is not None:
        return relayed_response(turn, generation, forwarded)
    if response_request.stream:
        writer = EventWriter(turn.draft)
        translation = StreamTranslation(writer, turn.tools)
        events = response_events(writer, translation, stream_generation(generation), turn.finished)
        return event_stream_response(events, writer.framing())
    body = turn.answered(run_generation(generation))
    return Response(dumps(body), mimetype="application/json")


def relayed_response(turn: Turn, generation: Generation, forwarded: dict[str, Any]) -> Response:
    """Answer a request passed through to an upstream that serves the Responses API."""
    call = native_call(turn, forwarded, generation)
    if call.stream:
        stream = RelayedStream(turn, generation)
        events = stream.events(relay_stream(generation, call, stream))
        return event_stream_response(events, stream.framing())
    answer, usage, cost = relay_generation(generation, call, whole_outcome(generation))
    body = answered_whole(turn, answer.decoded, usage, cost)
    return Response(dumps(body), mimetype="application/json")


@bp.get("/responses/<response_id>")
@require_api_key
def retrieve_response(response_id: str) -> Response:
    """Answer one of the caller's stored responses, as it was answered."""
    if request.args.get("stream", "false").lower() == "true":
        raise InvalidRequest(
            "stream replays background responses, which are not served here.", param="stream"
        )
    stored = find_stored_or_raise(response_id)
    return Response(stored.response, mimetype="application/json")


@bp.delete("/responses/<response_id>")
@require_api_key
def remove_response(response_id: str) -> Response:
    """Delete one of the caller's stored responses."""
    if not delete_response(g.caller.account_id, response_id):
        raise ResponseNotFound(response_id)
    body = {"id": response_id, "object": "response.deleted", "deleted": True}
    return Response(dumps(body), mimetype="application/json")


@bp.get("/responses/<response_id>/input_items")
@require_api_key
def list_input_items(response_id: str) -> Response:
    """List the items of a stored response's request, a page at a time (newest first)."""
    limit, order = page_size(request.args.get("limit")), sort_order(request.args.get("order"))
    items = loads(find_stored_or_raise(response_id).input_items)
    if order == "desc":
        items.reverse()
    after = request.args.get("after")
    if after is not None:
        ids = [item.get("id") for item in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    page = items[:limit]
    body = {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(items) > limit,
    }
    return Response(dumps(body), mimetype="application/json")


def find_stored_or_raise(response_id: str) -> StoredResponse:
    """Return the caller's stored response ``response_id``; raise ResponseNotFound."""
    stored = find_stored(g.caller.account_id, response_id)
    if stored is None:
        raise ResponseNotFound(response_id)
    return stored


def page_size(value: str | None) -> int:
    """Read ``limit``: 1 to 100, 20 when absent."""
    if value is None:
        return DEFAULT_PAGE
    # str.isdigit takes any script's digits (and ², which int() refuses).
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PAGE:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_PAGE}.", param="limit")
    return int(value)


def sort_order(value: str | None) -> str:
    """Read ``order``: asc or desc (the default)."""
    if value not in (None, "asc", "desc"):
        raise InvalidRequest("order must be asc or desc.", param="order")
    return value or "desc"
