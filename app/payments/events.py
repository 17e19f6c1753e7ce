"""Stripe's events, applied to the books exactly once.

Each event is applied in one transaction that first records its id (``stripe_events``):
a redelivered, duplicated or concurrent copy finds it recorded and changes nothing. The
order's change of state and its ledger entry are written in that same transaction,
each guarded by the state it leaves (pending -> paid grants; a refund takes back only
what Stripe's cumulative ``amount_refunded`` adds), so that events of one order arriving
in any order leave the same books. An event that contradicts its order (another amount,
another currency) is refused: nothing is recorded, and Stripe delivers it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Row

from app.credits.grants import grant_within, take_back_within
from app.database import utcnow, write_transaction
from app.money import to_money
from app.payments.models import (
    AUTO_TOPUP,
    DISPUTE_LOST,
    DISPUTE_OPEN,
    DISPUTE_WON,
    EXPIRED,
    FAILED,
    PAID,
    PENDING,
    PaymentOrder,
    StripeEvent,
)
from app.payments.topups import save_card, topup_failed, topup_paid

log = logging.getLogger(__name__)

orders = PaymentOrder.__table__
events = StripeEvent.__table__

# What applying an event did.
APPLIED, DUPLICATE, IGNORED = "applied", "duplicate", "ignored"


class EventRefused(Exception):
    """An event that contradicts its order, or comes before what it needs: Stripe retries it.

    The message names the event, the order and what did not match: never a secret.
    """


@dataclass(frozen=True)
class Outcome:
    """What an event did: APPLIED, DUPLICATE or IGNORED, and the order it concerned."""

    result: str
    order_id: str | None = None


def apply_event(event: dict[str, Any]) -> Outcome:
    """Apply a verified Stripe event to the books, once; return what it did.

    :raise EventRefused: its amount or currency does not match its order, or it needs an
        order paid that is not yet: nothing was recorded.
    """
    handler = HANDLERS.get(event["type"])
    if handler is None:
        return Outcome(IGNORED)
    return write_transaction(lambda connection: _apply(connection, event, handler))


Handler = Callable[[Connection, dict[str, Any]], str | None]


def _apply(connection: Connection, event: dict[str, Any], handler: Handler) -> Outcome:
    if not _record(connection, event["id"], event["type"]):
        return Outcome(DUPLICATE)
    order_id = handler(connection, event["data"]["object"])
    if order_id is not None:
        connection.execute(
            update(events).where(events.c.id == event["id"]).values(order_id=order_id)
        )
    return Outcome(APPLIED if order_id is not None else IGNORED, order_id)


def _record(connection: Connection, event_id: str, event_type: str) -> bool:
    """Record the event's id; False if it was recorded before (a concurrent copy waits here)."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    inserted = (
        dialect.insert(events)
        .values(id=event_id, type=event_type, received_at=utcnow())
        .on_conflict_do_nothing(index_elements=[events.c.id])
        .returning(events.c.id)
    )
    return connection.execute(inserted).first() is not None


def _order(connection: Connection, order_id: str | None) -> Row | None:
    """Read the order ``order_id``, its row locked until the transaction ends."""
    if not order_id:
        return None
    query = select(orders).where(orders.c.id == order_id).with_for_update()
    return connection.execute(query).first()


def _order_of_payment(connection: Connection, payment: dict[str, Any]) -> Row | None:
    """Find the order of a charge, a PaymentIntent or a dispute: by its metadata, or its intent."""
    order = _order(connection, (payment.get("metadata") or {}).get("order_id"))
    intent = _id_of(payment.get("payment_intent"))
    if order is None and intent:
        query = select(orders).where(orders.c.payment_intent_id == intent).with_for_update()
        order = connection.execute(query).first()
    return order


def _id_of(reference: Any) -> str | None:
    """Return the id of an object Stripe names by id, or expanded."""
    if isinstance(reference, dict):
        return reference.get("id")
    return reference


def _matching_order(connection: Connection, session: dict[str, Any]) -> Row | None:
    """Return the Checkout session's order, once its amount and currency are the order's.

    :raise EventRefused: they are not.
    """
    order = _order(connection, session.get("client_reference_id"))
    if order is None:
        return None
    charged, currency = session.get("amount_total"), session.get("currency")
    if charged != order.total_cents or currency != order.currency:
        raise EventRefused(
            f"order {order.id}: Checkout session {session.get('id')} charged {charged} "
            f"{currency}, the order is {order.total_cents} {order.currency}"
        )
    intent = _id_of(session.get("payment_intent"))
    if intent and order.payment_intent_id is None:
        connection.execute(
            update(orders).where(orders.c.id == order.id).values(payment_intent_id=intent)
        )
    return order


def _session_completed(connection: Connection, session: dict[str, Any]) -> str | None:
    """Pay the order of a completed Checkout session, if paid now (a delayed method: later)."""
    order = _matching_order(connection, session)
    if order is None:
        return None
    if session.get("payment_status") == "paid":
        _pay(connection, order)
    return order.id


def _session_paid(connection: Connection, session: dict[str, Any]) -> str | None:
    """Pay the order whose delayed payment method's money arrived."""
    order = _matching_order(connection, session)
    if order is None:
        return None
    _pay(connection, order)
    return order.id


def _session_failed(connection: Connection, session: dict[str, Any]) -> str | None:
    """Fail the order whose delayed payment method failed, unless it was paid after all."""
    return _end_unpaid(connection, session, FAILED)


def _session_expired(connection: Connection, session: dict[str, Any]) -> str | None:
    """Close the order whose Checkout session expired unpaid."""
    return _end_unpaid(connection, session, EXPIRED)


def _end_unpaid(connection: Connection, session: dict[str, Any], status: str) -> str | None:
    """Move the session's order from pending to ``status``; a paid order stays paid."""
    order = _matching_order(connection, session)
    if order is None:
        return None
    connection.execute(
        update(orders)
        .where(orders.c.id == order.id, orders.c.status == PENDING)
        .values(status=status)
    )
    return order.id


def _pay(connection: Connection, order: Row) -> None:
    """Mark the order paid and grant its credits; nothing if it was paid before."""
    paid = connection.execute(
        update(orders)
        .where(orders.c.id == order.id, orders.c.status != PAID)
        .values(status=PAID, paid_at=utcnow())
    )
    if paid.rowcount == 1:
        grant_within(
            connection,
            account_id=order.account_id,
            amount=order.amount,
            idempotency_key=f"order:{order.id}",
            description=f"Stripe payment, order {order.id}",
        )


def _charge_succeeded(connection: Connection, charge: dict[str, Any]) -> str | None:
    """Keep the charge's receipt link on its order."""
    order = _order_of_payment(connection, charge)
    if order is None:
        return None
    values: dict[str, Any] = {"receipt_url": charge.get("receipt_url")}
    intent = _id_of(charge.get("payment_intent"))
    if intent and order.payment_intent_id is None:
        values["payment_intent_id"] = intent
    connection.execute(update(orders).where(orders.c.id == order.id).values(values))
    customer, method = _id_of(charge.get("customer")), _id_of(charge.get("payment_method"))
    saved = (charge.get("metadata") or {}).get("save_card") == "true"
    if saved and customer and method:
        save_card(connection, order.account_id, customer, method)
    return order.id


def _intent_succeeded(connection: Connection, intent: dict[str, Any]) -> str | None:
    """Pay an auto top-up's order (a Checkout order is paid by its session's events)."""
    order = _order_of_payment(connection, intent)
    if order is None or order.kind != AUTO_TOPUP:
        return None
    charged = intent.get("amount_received", intent.get("amount"))
    if charged != order.total_cents or intent.get("currency") != order.currency:
        raise EventRefused(
            f"order {order.id}: PaymentIntent {intent.get('id')} charged {charged} "
            f"{intent.get('currency')}, the order is {order.total_cents} {order.currency}"
        )
    _pay(connection, order)
    topup_paid(connection, order.account_id)
    return order.id


def _intent_failed(connection: Connection, intent: dict[str, Any]) -> str | None:
    """Fail an auto top-up's order whose off-session payment failed."""
    order = _order_of_payment(connection, intent)
    if order is None or order.kind != AUTO_TOPUP:
        return None
    topup_failed(connection, order.id, order.account_id)
    return order.id


def _paid_order_of(connection: Connection, payment: dict[str, Any]) -> Row | None:
    """Return the paid order of a refunded or disputed charge; None if it is none of ours.

    :raise EventRefused: the order is not paid yet: its payment's event is still to come.
    """
    order = _order_of_payment(connection, payment)
    if order is not None and order.status != PAID:
        raise EventRefused(f"order {order.id}: taken back before it was paid; later")
    return order


def _credit_of(order: Row, cents: int) -> Decimal:
    """Return the credit ``cents`` of the order's total buys (the fee's share left out)."""
    return to_money(order.amount * min(cents, order.total_cents) / order.total_cents)


def _charge_refunded(connection: Connection, charge: dict[str, Any]) -> str | None:
    """Take back the credit of what Stripe refunded since the last refund applied."""
    order = _paid_order_of(connection, charge)
    if order is None:
        return None
    refunded = int(charge.get("amount_refunded") or 0)
    target = _credit_of(order, refunded)
    moved = connection.execute(
        update(orders)
        .where(orders.c.id == order.id, orders.c.refunded_cents < refunded)
        .values(refunded_cents=refunded, taken_back=target)
    )
    if moved.rowcount == 1 and target > order.taken_back:
        take_back_within(
            connection,
            account_id=order.account_id,
            amount=target - order.taken_back,
            idempotency_key=f"order:{order.id}:refunded:{refunded}",
            description=f"Stripe refund, order {order.id}",
        )
    return order.id


def _dispute_created(connection: Connection, dispute: dict[str, Any]) -> str | None:
    """Take back the disputed amount of a charge while its dispute is open."""
    order = _paid_order_of(connection, dispute)
    if order is None:
        return None
    if _move_dispute(connection, order, None, DISPUTE_OPEN):
        _take_back_dispute(connection, order, dispute)
    return order.id


def _dispute_closed(connection: Connection, dispute: dict[str, Any]) -> str | None:
    """Close a dispute: won, its amount is given back; lost, it stays taken."""
    order = _paid_order_of(connection, dispute)
    if order is None:
        return None
    won = dispute.get("status") in ("won", "warning_closed")
    given_back = _credit_of(order, int(dispute.get("amount") or 0))
    if won and _move_dispute(connection, order, DISPUTE_OPEN, DISPUTE_WON) and given_back > 0:
        grant_within(
            connection,
            account_id=order.account_id,
            amount=given_back,
            idempotency_key=f"dispute:{dispute['id']}:won",
            description=f"Stripe dispute won, order {order.id}",
        )
    elif won:
        _move_dispute(connection, order, None, DISPUTE_WON)
    elif not _move_dispute(connection, order, DISPUTE_OPEN, DISPUTE_LOST):
        # Closed before its opening was applied: lost, its amount is taken now.
        if _move_dispute(connection, order, None, DISPUTE_LOST):
            _take_back_dispute(connection, order, dispute)
    return order.id


def _move_dispute(connection: Connection, order: Row, was: str | None, now: str) -> bool:
    """Move the order's dispute from ``was`` to ``now``; False if it was not ``was``."""
    state = orders.c.dispute.is_(None) if was is None else orders.c.dispute == was
    moved = connection.execute(
        update(orders).where(orders.c.id == order.id, state).values(dispute=now)
    )
    return moved.rowcount == 1


def _take_back_dispute(connection: Connection, order: Row, dispute: dict[str, Any]) -> None:
    amount = _credit_of(order, int(dispute.get("amount") or 0))
    if amount <= 0:
        return
    take_back_within(
        connection,
        account_id=order.account_id,
        amount=amount,
        idempotency_key=f"dispute:{dispute['id']}",
        description=f"Stripe dispute, order {order.id}",
    )


HANDLERS: dict[str, Handler] = {
    "checkout.session.completed": _session_completed,
    "checkout.session.async_payment_succeeded": _session_paid,
    "checkout.session.async_payment_failed": _session_failed,
    "checkout.session.expired": _session_expired,
    "charge.succeeded": _charge_succeeded,
    "payment_intent.succeeded": _intent_succeeded,
    "payment_intent.payment_failed": _intent_failed,
    "charge.refunded": _charge_refunded,
    "charge.dispute.created": _dispute_created,
    "charge.dispute.closed": _dispute_closed,
}
