"""POST /billing/stripe/webhook: Stripe's events, verified by the library's own check.

The door verifies the ``Stripe-Signature`` header against STRIPE_WEBHOOK_SECRET with
``stripe.Webhook.construct_event`` and hands the event to the payments domain. A 2xx
tells Stripe the event is applied (or was before, or is none of ours); anything else,
that it must deliver it again.
"""

from __future__ import annotations

import json
import logging

import stripe
from flask import Blueprint, Response, current_app, request

from app.encoding import dumps
from app.errors import APIError, InvalidRequest
from app.payments.events import EventRefused, apply_event

log = logging.getLogger(__name__)

bp = Blueprint("billing", __name__)


class WebhookNotSetUp(APIError):
    """STRIPE_WEBHOOK_SECRET is not set: no event can be verified (503)."""

    status = 503
    type = "service_unavailable"
    code = "webhook_not_configured"
    default_message = "Stripe's webhook is not set up on this gateway."


class SignatureRefused(APIError):
    """The Stripe-Signature header does not verify the body (400)."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_signature"
    default_message = "The Stripe-Signature header does not match the body."


class EventNotApplied(APIError):
    """The event contradicts its order, or came too early: Stripe delivers it again (409)."""

    status = 409
    type = "invalid_request_error"
    code = "event_not_applied"
    default_message = "The event does not match its order; it was not applied."


@bp.post("/billing/stripe/webhook")
def stripe_webhook() -> Response:
    """Apply one Stripe event to the books, once."""
    secret = current_app.config.get("STRIPE_WEBHOOK_SECRET")
    if not secret:
        raise WebhookNotSetUp()
    payload = request.get_data()
    try:
        event = json.loads(payload)
    except ValueError:
        event = None
    if not _is_event(event):
        # Read before it is verified, so that the library is handed an event's shape.
        raise InvalidRequest("The body is not a Stripe event.")
    try:
        stripe.Webhook.construct_event(payload, request.headers.get("Stripe-Signature"), secret)
    except (ValueError, stripe.SignatureVerificationError) as error:
        log.warning("Stripe webhook refused: %s", type(error).__name__)
        raise SignatureRefused() from None
    try:
        outcome = apply_event(event)
    except EventRefused as refused:
        # What did not match, by ids and amounts; never the payload or a secret.
        log.error("Stripe event %s (%s) not applied: %s", event.get("id"), event["type"], refused)
        raise EventNotApplied() from None
    body = {"received": True, "result": outcome.result}
    return Response(dumps(body), mimetype="application/json")


def _is_event(event: object) -> bool:
    """Tell whether ``event`` has an event's id, type and object."""
    return (
        isinstance(event, dict)
        and isinstance(event.get("id"), str)
        and isinstance(event.get("type"), str)
        and isinstance(event.get("data"), dict)
        and isinstance(event["data"].get("object"), dict)
    )
