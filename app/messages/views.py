"""POST /v1/messages and POST /v1/messages/count_tokens (also with Claude Code's ``?beta=true``)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, g, request

from app.auth.decorators import require_api_key
from app.catalog.pricing import NO_SURCHARGES
from app.catalog.registry import current_catalog
from app.encoding import dumps
from app.generations.decorators import claimed_generation_id, honour_idempotency_key
from app.generations.lifecycle import (
    Generation,
    count_prompt_tokens,
    native_routes,
    relay_generation,
    relay_stream,
    run_generation,
    start_generation,
    stream_generation,
)
from app.generations.models import MESSAGES
from app.generations.prompts import TranslatedPrompt, sent_prompt
from app.generations.refusals import output_field_named
from app.messages.bodies import MESSAGES_FRAMING, new_message_id
from app.messages.native import (
    SENT_BODY,
    RelayedStream,
    answered,
    native_call,
    passed_request,
    surcharges_of,
    whole_outcome,
)
from app.messages.schemas import parse_count_tokens_request, parse_messages_request
from app.messages.translation import (
    StreamTranslation,
    chat_request,
    message_of,
    thinking_omitted,
)
from app.observability.trace import current_trace
from app.request_body import json_body
from app.sse import event_stream_response

bp = Blueprint("messages", __name__)


@bp.post("/messages")
@require_api_key
@honour_idempotency_key(new_message_id)
def create_message() -> Response:
    """Answer a Messages API request, whole or streamed, paid from the caller's credits."""
    body = json_body()
    messages_request = parse_messages_request(body)
    model = current_catalog().resolve(messages_request.model, may_use=g.caller.may_use)
    passed_through = bool(native_routes(model, MESSAGES))
    with output_field_named("max_tokens"):
        generation = start_generation(
            caller=g.caller,
            model=model,
            request=passed_request(messages_request, model)
            if passed_through
            else model.with_defaults(chat_request(messages_request, model)),
            hold_ttl_seconds=current_app.config["HOLD_TTL_SECONDS"],
            generation_id=claimed_generation_id() or new_message_id(),
            api=MESSAGES,
            # A translated route is sent neither server tools nor a tier: nothing to bill.
            surcharges=surcharges_of(body) if passed_through else NO_SURCHARGES,
            prompt=sent_prompt(body, SENT_BODY, model) if passed_through else None,
        )
    if passed_through:
        return relayed_message(generation, body, stream=messages_request.stream)
    omitted = thinking_omitted(messages_request)
    if messages_request.stream:
        translation = StreamTranslation(generation, omitted=omitted)
        events = translation.events(stream_generation(generation))
        return event_stream_response(events, MESSAGES_FRAMING)
    body = message_of(generation, run_generation(generation), omitted=omitted)
    return Response(dumps(body), mimetype="application/json")


def relayed_message(generation: Generation, body: dict, *, stream: bool) -> Response:
    """Answer a request passed through to an upstream that serves the Messages API."""
    call = native_call(body, generation, request.headers, stream=stream)
    if stream:
        relayed = RelayedStream(generation)
        events = relayed.events(relay_stream(generation, call, relayed))
        return event_stream_response(events, relayed.framing())
    answer, usage, cost = relay_generation(generation, call, whole_outcome(generation))
    body = answered(answer.decoded, generation, cost, usage)
    return Response(dumps(body), mimetype="application/json")


@bp.post("/messages/count_tokens")
@require_api_key
def count_message_tokens() -> Response:
    """Count a prompt's tokens as a hold on its model does; free, nothing is held or recorded.

    On a model whose requests are passed through, that is the body as it would be sent.
    """
    body = json_body()
    messages_request = parse_count_tokens_request(body)
    model = current_catalog().resolve(messages_request.model, may_use=g.caller.may_use)
    if native_routes(model, MESSAGES):
        prompt = sent_prompt(body, SENT_BODY, model)
    else:
        prompt = TranslatedPrompt(chat_request(messages_request, model), model.routes[0])
    tokens = count_prompt_tokens(model=model, prompt=prompt)
    return Response(dumps({"input_tokens": tokens}), mimetype="application/json")


@bp.after_request
def add_anthropic_headers(response: Response) -> Response:
    """Name the request as Anthropic does; tell clients a refused key is not worth retrying.

    Claude Code retries a 401 for minutes unless ``x-should-retry`` says otherwise.
    """
    response.headers["request-id"] = current_trace().request_id
    if response.status_code == 401:
        response.headers["x-should-retry"] = "false"
    return response
