"""Auto top-up: an off-session payment with the saved card when the balance falls too low.

A worker's sweeper looks for organisations whose balance is below their threshold.
Claiming one clears its ``armed`` flag and places a pending order in one transaction,
conditional on the flag and on the balance still below the threshold, and a partial
unique index allows one pending top-up order per organisation: however many workers
see the same crossing, one PaymentIntent is created, with the order's id as its
Idempotency-Key. The credit comes as for any order, from Stripe's
``payment_intent.succeeded`` (app.payments.events). A declined payment, or one that
needs its holder, fails its order; three in a row turn auto top-up off and alert the
organisation (``topup.failed``).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from dataclasses import dataclass
from decimal import Decimal

import stripe
from sqlalchemy import and_, exists, or_, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.alerts.models import AlertEvent
from app.credits.models import Account
from app.database import utcnow, write_transaction
from app.extensions import db
from app.payments.models import (
    AUTO_TOPUP,
    FAILED,
    PENDING,
    TOPUP_FAILURES_ALLOWED,
    AutoTopup,
    PaymentOrder,
)
from app.payments.orders import CURRENCY, InvalidAmount, quote
from app.payments.stripe_api import buying_enabled, stripe_client

log = logging.getLogger(__name__)

TOPUP_FAILED = "topup.failed"
topups = AutoTopup.__table__
orders = PaymentOrder.__table__
accounts = Account.__table__


@dataclass(frozen=True)
class ClaimedTopup:
    """A pending top-up order, and the saved card that pays it."""

    order_id: str
    account_id: int
    total_cents: int
    customer_id: str
    payment_method_id: str


def topup_of(account_id: int) -> AutoTopup | None:
    """Return the organisation's auto top-up settings and card, or None."""
    topup = db.session.get(AutoTopup, account_id)
    db.session.commit()
    return topup


def configure(account_id: int, *, enabled: bool, threshold: Decimal, amount: Decimal) -> None:
    """Set when auto top-up buys (below ``threshold``) and how much; turn it on or off.

    :raise InvalidAmount: the amount is outside what one purchase may be, the threshold
        is not positive, or it is turned on without a saved card.
    """
    quote(str(amount))
    if threshold <= 0:
        raise InvalidAmount("The threshold must be a positive amount of USD.")
    topup = db.session.get(AutoTopup, account_id)
    if enabled and (topup is None or topup.payment_method_id is None):
        raise InvalidAmount("Save a card first: tick it when you add credits.")
    if topup is None:
        topup = AutoTopup(account_id=account_id, armed=True, failures=0)
        db.session.add(topup)
    topup.enabled, topup.threshold, topup.amount = enabled, threshold, amount
    if enabled:
        topup.armed, topup.failures = True, 0
    db.session.commit()


def save_card(connection: Connection, account_id: int, customer: str, method: str) -> None:
    """Keep the card a Checkout payment saved for off-session use, in the caller's transaction."""
    saved = connection.execute(
        update(topups)
        .where(topups.c.account_id == account_id)
        .values(customer_id=customer, payment_method_id=method)
    )
    if saved.rowcount == 0:
        connection.execute(
            topups.insert().values(
                account_id=account_id,
                enabled=False,
                customer_id=customer,
                payment_method_id=method,
                armed=True,
                failures=0,
            )
        )


def top_up_where_due() -> int:
    """Pay one top-up for each organisation below its threshold; return how many were made."""
    if not buying_enabled():
        return 0
    write_transaction(_rearm)
    due = select(topups.c.account_id).where(
        topups.c.enabled,
        topups.c.armed,
        topups.c.payment_method_id.is_not(None),
        topups.c.account_id == accounts.c.id,
        accounts.c.balance < topups.c.threshold,
    )
    account_ids = list(db.session.scalars(due))
    db.session.commit()
    made = 0
    for account_id in account_ids:
        claimed = _claim(account_id)
        if claimed is not None:
            made += _pay_off_session(claimed)
    return made


def _rearm(connection: Connection) -> None:
    """Arm again each top-up with none pending whose balance is back at its threshold.

    Or whose last payment failed: it is tried again, once a sweep, until it is paid or
    turned off.
    """
    balance = select(accounts.c.balance).where(accounts.c.id == topups.c.account_id)
    pending = exists().where(
        orders.c.account_id == topups.c.account_id,
        orders.c.kind == AUTO_TOPUP,
        orders.c.status == PENDING,
    )
    connection.execute(
        update(topups)
        .where(
            and_(
                ~topups.c.armed,
                topups.c.enabled,
                ~pending,
                or_(balance.scalar_subquery() >= topups.c.threshold, topups.c.failures > 0),
            )
        )
        .values(armed=True)
    )


def _claim(account_id: int) -> ClaimedTopup | None:
    """Disarm the organisation's top-up and place its pending order; None if another did."""
    try:
        return write_transaction(lambda connection: _claim_in(connection, account_id))
    except IntegrityError:
        return None  # a top-up of this organisation is pending already


def _claim_in(connection: Connection, account_id: int) -> ClaimedTopup | None:
    # The balance is read again as the flag is cleared: between a sweep's reading and its
    # claim, another's top-up may have been paid and re-armed, ending the crossing it read.
    balance = select(accounts.c.balance).where(accounts.c.id == account_id).scalar_subquery()
    taken = connection.execute(
        update(topups)
        .where(
            topups.c.account_id == account_id,
            topups.c.armed,
            topups.c.enabled,
            balance < topups.c.threshold,
        )
        .values(armed=False)
        .returning(topups.c.amount, topups.c.customer_id, topups.c.payment_method_id)
    ).first()
    if taken is None:
        return None
    priced = quote(f"{taken.amount:.2f}")
    order_id = "ord_" + secrets.token_hex(12)
    connection.execute(
        orders.insert().values(
            id=order_id,
            account_id=account_id,
            kind=AUTO_TOPUP,
            amount=priced.amount,
            fee=priced.fee,
            total_cents=priced.total_cents,
            currency=CURRENCY,
            status=PENDING,
            refunded_cents=0,
            taken_back=0,
            created_at=utcnow(),
        )
    )
    return ClaimedTopup(
        order_id, account_id, priced.total_cents, taken.customer_id, taken.payment_method_id
    )


def _pay_off_session(claimed: ClaimedTopup) -> int:
    """Ask Stripe for the off-session payment; return 1 if asked, 0 if it failed at once."""
    params = {
        "amount": claimed.total_cents,
        "currency": CURRENCY,
        "customer": claimed.customer_id,
        "payment_method": claimed.payment_method_id,
        "off_session": True,
        "confirm": True,
        "metadata": {"order_id": claimed.order_id},
    }
    try:
        intent = stripe_client().v1.payment_intents.create(
            params, {"idempotency_key": f"topup-{claimed.order_id}"}
        )
    except stripe.StripeError as error:
        # Declined, authentication required, or Stripe unreachable: if it was paid after
        # all, payment_intent.succeeded pays the order later.
        log.warning("auto top-up %s failed: %s", claimed.order_id, type(error).__name__)
        write_transaction(
            lambda connection: topup_failed(connection, claimed.order_id, claimed.account_id)
        )
        return 0
    write_transaction(
        lambda connection: connection.execute(
            update(orders)
            .where(orders.c.id == claimed.order_id, orders.c.payment_intent_id.is_(None))
            .values(payment_intent_id=intent.id)
        )
    )
    return 1


def topup_failed(connection: Connection, order_id: str, account_id: int) -> None:
    """Fail a pending top-up order; the third failure in a row turns auto top-up off.

    Until then the next sweep tries again.
    """
    failed = connection.execute(
        update(orders)
        .where(orders.c.id == order_id, orders.c.status == PENDING)
        .values(status=FAILED)
    )
    if failed.rowcount != 1:
        return
    failures = connection.execute(
        update(topups)
        .where(topups.c.account_id == account_id)
        .values(failures=topups.c.failures + 1)
        .returning(topups.c.failures)
    ).scalar_one()
    if failures < TOPUP_FAILURES_ALLOWED:
        return  # tried again at the next sweep (_rearm)
    connection.execute(
        update(topups).where(topups.c.account_id == account_id).values(enabled=False)
    )
    data = {"organisation_id": account_id, "order_id": order_id, "failures": failures}
    connection.execute(
        AlertEvent.__table__.insert().values(
            account_id=account_id,
            type=TOPUP_FAILED,
            data=json.dumps(data),
            created=int(time.time()),
            fanned_out=False,
        )
    )


def topup_paid(connection: Connection, account_id: int) -> None:
    """Count the failures in a row from nothing again: a top-up was paid."""
    connection.execute(update(topups).where(topups.c.account_id == account_id).values(failures=0))
