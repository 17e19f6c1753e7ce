"""Orders of credits: what a holder may buy, its fee, and the Checkout session that pays it.

An order is placed pending before its holder is sent to Stripe Checkout, with the
order's id as the session's ``client_reference_id``; only Stripe's webhook marks it paid
and grants its credits (app.payments.events).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

import stripe
from flask import current_app
from sqlalchemy import select

from app.extensions import db
from app.payments.models import CHECKOUT, FAILED, PENDING, PaymentOrder
from app.payments.stripe_api import stripe_client

CENT = Decimal("0.01")
CURRENCY = "usd"


class InvalidAmount(ValueError):
    """An amount a holder may not buy: not USD in cents, or outside the operator's bounds."""


class CheckoutUnavailable(Exception):
    """Stripe did not open a Checkout session; nothing was charged."""


@dataclass(frozen=True)
class Quote:
    """What buying ``amount`` USD of credits costs: the fee on top, and the total."""

    amount: Decimal
    fee: Decimal

    @property
    def total(self) -> Decimal:
        """What the holder pays."""
        return self.amount + self.fee

    @property
    def total_cents(self) -> int:
        """What Stripe is asked to charge, in cents."""
        return int(self.total * 100)


@dataclass(frozen=True)
class TopupBounds:
    """What one purchase may be (USD) and the fee added to it (percent)."""

    minimum: Decimal
    maximum: Decimal
    fee_percent: Decimal


def topup_bounds() -> TopupBounds:
    """Return the operator's TOPUP_MIN_USD, TOPUP_MAX_USD and TOPUP_FEE_PERCENT."""
    config = current_app.config
    return TopupBounds(
        Decimal(config["TOPUP_MIN_USD"]),
        Decimal(config["TOPUP_MAX_USD"]),
        Decimal(config["TOPUP_FEE_PERCENT"]),
    )


def quote(text: str) -> Quote:
    """Parse ``text`` as an amount to buy and price it.

    :raise InvalidAmount: not an amount in whole cents, or outside the operator's bounds.
    """
    bounds = topup_bounds()
    amount = usd_in_cents(text)
    if not bounds.minimum <= amount <= bounds.maximum:
        raise InvalidAmount(
            f"The amount must be between ${bounds.minimum:.2f} and ${bounds.maximum:.2f}."
        )
    fee = (amount * bounds.fee_percent / 100).quantize(CENT, rounding=ROUND_HALF_UP)
    return Quote(amount=amount, fee=fee)


def usd_in_cents(text: str) -> Decimal:
    """Parse ``text`` as an amount of USD in whole cents. :raise InvalidAmount: it is not."""
    try:
        amount = Decimal(text.strip().removeprefix("$"))
    except InvalidOperation:
        raise InvalidAmount(f"{text!r} is not an amount in USD") from None
    if not amount.is_finite() or amount != amount.quantize(CENT):
        raise InvalidAmount("Amounts are in USD, in whole cents.")
    return amount


def place_order(account_id: int, priced: Quote) -> PaymentOrder:
    """Record a pending order of ``priced`` for the organisation; return it."""
    order = PaymentOrder(
        id="ord_" + secrets.token_hex(12),
        account_id=account_id,
        kind=CHECKOUT,
        amount=priced.amount,
        fee=priced.fee,
        total_cents=priced.total_cents,
        currency=CURRENCY,
        status=PENDING,
    )
    db.session.add(order)
    db.session.commit()
    return order


def start_checkout(
    order: PaymentOrder,
    *,
    success_url: str,
    cancel_url: str,
    email: str | None = None,
    save_card: bool = False,
) -> str:
    """Open Stripe Checkout (``mode=payment``) for ``order``; return the page to send its holder to.

    ``save_card``: the card is kept for off-session payments (auto top-up), with a
    Customer made for it.

    :raise CheckoutUnavailable: Stripe refused or could not be reached.
    """
    line_items = [_line("Credits", order.amount)]
    if order.fee:
        line_items.append(_line("Fee", order.fee))
    params = {
        "mode": "payment",
        "client_reference_id": order.id,
        "line_items": line_items,
        "success_url": success_url,
        "cancel_url": cancel_url,
        "metadata": {"order_id": order.id},
        # The PaymentIntent, and so its charge, carry the order too: refunds and
        # disputes, which name the charge, find their order by it.
        "payment_intent_data": {"metadata": {"order_id": order.id}},
    }
    if email:
        params["customer_email"] = email
    if save_card:
        params["customer_creation"] = "always"
        params["payment_intent_data"] = {
            "metadata": {"order_id": order.id, "save_card": "true"},
            "setup_future_usage": "off_session",
        }
    try:
        session = stripe_client().v1.checkout.sessions.create(
            params, {"idempotency_key": f"checkout-{order.id}"}
        )
    except stripe.StripeError as error:
        current_app.logger.warning(
            "order %s: Stripe did not open Checkout: %s", order.id, type(error).__name__
        )
        # No session: nothing can pay this order, which would otherwise stay pending.
        order.status = FAILED
        db.session.commit()
        raise CheckoutUnavailable(order.id) from None
    order.checkout_session_id = session.id
    db.session.commit()
    return session.url


def _line(name: str, usd: Decimal) -> dict:
    return {
        "price_data": {
            "currency": CURRENCY,
            "unit_amount": int(usd * 100),
            "product_data": {"name": name},
        },
        "quantity": 1,
    }


def find_order(account_id: int, order_id: str) -> PaymentOrder | None:
    """Return the organisation's order ``order_id``, read afresh, or None."""
    order = db.session.scalar(
        select(PaymentOrder).where(
            PaymentOrder.id == order_id, PaymentOrder.account_id == account_id
        )
    )
    if order is not None:
        db.session.refresh(order)
    db.session.commit()
    return order
