"""The Stripe client the gateway calls with: its key, and the API's address (STRIPE_API_BASE)."""

from __future__ import annotations

import stripe
from flask import current_app

# The app's key under which one client per (key, address) is kept.
_CLIENTS = "stripe_clients"


class PaymentsNotSetUp(Exception):
    """STRIPE_SECRET_KEY is not set: holders cannot buy credits here."""


def buying_enabled() -> bool:
    """Tell whether holders may buy credits: whether the operator set STRIPE_SECRET_KEY."""
    return bool(current_app.config.get("STRIPE_SECRET_KEY"))


def stripe_client() -> stripe.StripeClient:
    """Return the process's Stripe client for the configured key and API address.

    :raise PaymentsNotSetUp: there is no key.
    """
    key = current_app.config.get("STRIPE_SECRET_KEY")
    if not key:
        raise PaymentsNotSetUp("STRIPE_SECRET_KEY is not set")
    base = current_app.config.get("STRIPE_API_BASE")
    clients = current_app.extensions.setdefault(_CLIENTS, {})
    client = clients.get((key, base))
    if client is None:
        addresses = {"api": base.rstrip("/")} if base else None
        # The library retries a lost connection itself, with the same Idempotency-Key.
        client = stripe.StripeClient(key, base_addresses=addresses, max_network_retries=2)
        clients[(key, base)] = client
    return client
