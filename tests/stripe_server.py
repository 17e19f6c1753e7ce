"""A local Stripe for tests: the API calls the gateway makes, and the events Stripe sends.

It answers ``POST /v1/checkout/sessions`` with a Checkout Session in Stripe's shape and
keeps it; ``GET /pay/<session id>`` stands in for Stripe's hosted Checkout page: it pays
the session (a PaymentIntent and its charge), delivers ``checkout.session.completed``
and ``charge.succeeded`` to the gateway's webhook, signed as Stripe signs them (the
``stripe`` library's own scheme), and redirects to the session's ``success_url``. The
tests make Stripe's other events (refunds, disputes, delayed payments) from what it keeps.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import requests
import stripe

API_VERSION = stripe.api_version
WEBHOOK_SECRET = "whsec_" + "test" * 8
SECRET_KEY = "sk_test_" + "gateway" * 4


def stripe_id(prefix: str) -> str:
    """Return a fresh id in Stripe's form: ``cs_test_…``, ``pi_…``, ``evt_…``."""
    return f"{prefix}_{secrets.token_hex(12)}"


def nested(form: list[tuple[str, str]]) -> dict[str, Any]:
    """Read Stripe's form encoding (``a[b][0][c]=v``) back into objects and lists."""
    root: dict[str, Any] = {}
    for key, value in form:
        parts = key.replace("]", "").split("[")
        node: Any = root
        for part, following in zip(parts, parts[1:] + [None], strict=True):
            if following is None:
                node[part] = value
            else:
                default: Any = [] if following.isdigit() else {}
                if isinstance(node, list):
                    index = int(part)
                    while len(node) <= index:
                        node.append(default)
                    node = node[index]
                else:
                    node = node.setdefault(part, default)
    return _lists(root)


def _lists(node: Any) -> Any:
    if isinstance(node, dict):
        return {key: _lists(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_lists(value) for value in node]
    return node


@dataclass
class FakeStripe:
    """The server's state: what the gateway asked, and the objects it made."""

    url: str = ""
    webhook_url: str = ""
    requests: list[tuple[str, str, dict, dict]] = field(default_factory=list)
    sessions: dict[str, dict] = field(default_factory=dict)
    charges: dict[str, dict] = field(default_factory=dict)
    deliveries: list[tuple[str, int]] = field(default_factory=list)
    # When set, the events of a payment wait in ``held`` until release() sends them:
    # a webhook that lands after its buyer is back on the gateway.
    hold_events: bool = False
    intents: dict[str, dict] = field(default_factory=dict)
    held: list[dict] = field(default_factory=list)

    def release(self) -> None:
        """Deliver the events held back, in order."""
        while self.held:
            self.deliver(self.held.pop(0))

    def event(self, event_type: str, obj: dict, event_id: str | None = None) -> dict:
        """Return an event of ``event_type`` about ``obj``, as Stripe sends it."""
        return {
            "id": event_id or stripe_id("evt"),
            "object": "event",
            "api_version": API_VERSION,
            "created": int(time.time()),
            "data": {"object": json.loads(json.dumps(obj))},
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "type": event_type,
        }

    def deliver(self, event: dict, secret: str = WEBHOOK_SECRET) -> requests.Response:
        """POST ``event`` to the gateway's webhook, signed with ``secret``."""
        answer = self.deliver_raw(json.dumps(event).encode(), secret)
        self.deliveries.append((event["type"], answer.status_code))
        return answer

    def deliver_raw(self, payload: bytes, secret: str = WEBHOOK_SECRET) -> requests.Response:
        """POST ``payload`` to the gateway's webhook, signed as Stripe signs."""
        header = stripe.WebhookSignature.generate_signature_header(payload.decode(), secret)
        return requests.post(
            self.webhook_url,
            data=payload,
            headers={"Stripe-Signature": header, "Content-Type": "application/json"},
            timeout=30,
        )

    def pay(self, session_id: str) -> tuple[dict, dict]:
        """Pay the session as Checkout would: return it (paid) and its charge."""
        session = self.sessions[session_id]
        intent = stripe_id("pi")
        charge = {
            "id": stripe_id("ch"),
            "object": "charge",
            "amount": session["amount_total"],
            "amount_captured": session["amount_total"],
            "amount_refunded": 0,
            "currency": session["currency"],
            "paid": True,
            "refunded": False,
            "status": "succeeded",
            "payment_intent": intent,
            "metadata": dict(session.get("payment_intent_data", {}).get("metadata", {})),
            "receipt_url": f"{self.url}/receipts/{intent}",
        }
        if session.get("payment_intent_data", {}).get("setup_future_usage") == "off_session":
            charge["customer"] = stripe_id("cus")
            charge["payment_method"] = "pm_card_visa"
        session.update(status="complete", payment_status="paid", payment_intent=intent)
        self.charges[charge["id"]] = charge
        return session, charge

    def checkout(self, session_id: str) -> str:
        """Pay the session as its buyer would on Checkout; return where Stripe sends them."""
        session, charge = self.pay(session_id)
        paid = [
            self.event("checkout.session.completed", _public(session)),
            self.event("charge.succeeded", charge),
        ]
        if self.hold_events:
            self.held.extend(paid)
        else:
            for event in paid:
                self.deliver(event)
        return session["success_url"].replace("{CHECKOUT_SESSION_ID}", session_id)

    def refund(self, charge_id: str, cents: int) -> dict:
        """Refund ``cents`` more of the charge; return it as charge.refunded carries it."""
        charge = self.charges[charge_id]
        charge["amount_refunded"] += cents
        charge["refunded"] = charge["amount_refunded"] >= charge["amount"]
        return charge

    def dispute(self, charge_id: str, status: str = "needs_response") -> dict:
        """Return a dispute of the whole charge, in ``status``."""
        charge = self.charges[charge_id]
        return {
            "id": "dp_" + charge_id[3:],
            "object": "dispute",
            "amount": charge["amount"],
            "charge": charge_id,
            "currency": charge["currency"],
            "payment_intent": charge["payment_intent"],
            "status": status,
        }


def checkout_session(fake: FakeStripe, params: dict) -> dict:
    """Make a Checkout Session from the create call's parameters, in Stripe's shape."""
    items = params.get("line_items", [])
    total = sum(
        int(item["price_data"]["unit_amount"]) * int(item.get("quantity", 1)) for item in items
    )
    session_id = stripe_id("cs_test")
    return {
        "id": session_id,
        "object": "checkout.session",
        "amount_subtotal": total,
        "amount_total": total,
        "client_reference_id": params.get("client_reference_id"),
        "currency": items[0]["price_data"]["currency"] if items else "usd",
        "customer_email": params.get("customer_email"),
        "livemode": False,
        "metadata": params.get("metadata", {}),
        "mode": params.get("mode"),
        "payment_intent": None,
        "payment_intent_data": params.get("payment_intent_data", {}),
        "payment_status": "unpaid",
        "status": "open",
        "success_url": params.get("success_url"),
        "cancel_url": params.get("cancel_url"),
        "url": f"{fake.url}/pay/{session_id}",
    }


@contextmanager
def stripe_serving() -> Iterator[FakeStripe]:
    """Serve a FakeStripe on a free port until the block ends."""
    fake = FakeStripe()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Request-Id", stripe_id("req"))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            length = int(self.headers.get("Content-Length") or 0)
            form = parse_qsl(self.rfile.read(length).decode(), keep_blank_values=True)
            params = nested(form)
            with lock:
                fake.requests.append(("POST", self.path, params, dict(self.headers)))
            if self.headers.get("Authorization") != f"Bearer {SECRET_KEY}":
                error = {"type": "invalid_request_error", "message": "Invalid API Key provided"}
                self._answer(401, {"error": error})
            elif self.path == "/v1/payment_intents":
                status, intent = payment_intent(params)
                with lock:
                    fake.intents[intent["id"]] = intent
                body = intent if status == 200 else {"error": _declined(intent)}
                self._answer(status, body)
            elif self.path == "/v1/checkout/sessions":
                session = checkout_session(fake, params)
                with lock:
                    fake.sessions[session["id"]] = session
                self._answer(200, _public(session))
            else:
                self._answer(404, {"error": {"type": "invalid_request_error", "message": "?"}})

        def do_GET(self) -> None:  # noqa: N802 - the standard library's name
            if not self.path.startswith("/pay/"):
                self._answer(404, {"error": {"type": "invalid_request_error"}})
                return
            target = fake.checkout(self.path.removeprefix("/pay/"))
            self.send_response(303)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


# The test card Stripe declines (its documented PaymentMethod for a generic decline).
DECLINED_CARD = "pm_card_chargeDeclined"


def payment_intent(params: dict) -> tuple[int, dict]:
    """Confirm an off-session PaymentIntent: succeeded, or declined for DECLINED_CARD."""
    declined = params.get("payment_method") == DECLINED_CARD
    amount = int(params["amount"])
    return (402 if declined else 200), {
        "id": stripe_id("pi"),
        "object": "payment_intent",
        "amount": amount,
        "amount_received": 0 if declined else amount,
        "currency": params["currency"],
        "customer": params.get("customer"),
        "payment_method": params.get("payment_method"),
        "metadata": params.get("metadata", {}),
        "status": "requires_payment_method" if declined else "succeeded",
    }


def _declined(intent: dict) -> dict:
    return {
        "type": "card_error",
        "code": "card_declined",
        "decline_code": "generic_decline",
        "message": "Your card was declined.",
        "payment_intent": intent,
    }


def _public(session: dict) -> dict:
    """Return the session as Stripe's API shows it (without what only the create call took)."""
    return {key: value for key, value in session.items() if key != "payment_intent_data"}
