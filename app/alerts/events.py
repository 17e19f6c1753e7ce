"""What an alert event says on the wire, and how a webhook's body is signed."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from app.alerts.models import AlertEvent
from app.money import usd_text

BALANCE_BELOW_THRESHOLD = "balance.below_threshold"
BUDGET_THRESHOLD_REACHED = "budget.threshold_reached"
BUDGET_EXHAUSTED = "budget.exhausted"
SIGNATURE_HEADER = "Gateway-Signature"
# Fields the database writes in money units; the wire carries them as USD text.
_MONEY_FIELDS = ("threshold", "balance", "budget", "spent")


def event_body(event: AlertEvent) -> bytes:
    """Return the JSON body of ``event``: ``{"id","type","created","data"}``."""
    data: dict[str, Any] = json.loads(event.data)
    for name in _MONEY_FIELDS:
        if isinstance(data.get(name), int):
            data[name] = usd_text(data[name])
    payload = {"id": f"evt_{event.id}", "type": event.type, "created": event.created, "data": data}
    return json.dumps(payload, separators=(",", ":")).encode()


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """Return the Gateway-Signature header: ``t=<unix time>,v1=<hex HMAC-SHA256>``.

    The HMAC is of ``"<t>.<body>"`` under the endpoint's secret, so that a receiver can
    refuse a replayed body by its time.
    """
    signed = f"{timestamp}.".encode() + body
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def event_text(event: AlertEvent) -> tuple[str, str]:
    """Return an e-mail's subject and plain-text body for ``event``."""
    data = json.loads(event_body(event))["data"]
    if event.type == BALANCE_BELOW_THRESHOLD:
        subject = f"Balance below ${data['threshold']}"
        body = (
            f"The balance of organisation {data['organisation_id']} fell to "
            f"${data['balance']}, below its alert threshold of ${data['threshold']}.\n"
        )
        return subject, body
    if event.type in (BUDGET_THRESHOLD_REACHED, BUDGET_EXHAUSTED):
        holder = f"member {data['member_id']}" if "member_id" in data else f"key {data['key_id']}"
        reached = "used up" if event.type == BUDGET_EXHAUSTED else f"{data['percent']}% used"
        subject = f"Budget of {holder} {reached}"
        body = (
            f"In organisation {data['organisation_id']}, {holder} spent ${data['spent']} of its "
            f"${data['budget']} budget this {data['window']}.\n"
        )
        return subject, body
    return event.type, json.dumps(data, indent=2) + "\n"
