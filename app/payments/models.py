"""Orders of credits, the Stripe events applied to them, and redemption codes."""

from __future__ import annotations

from sqlalchemy import Boolean, CheckConstraint, ForeignKey, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from app.database import Money, UTCDateTime, utcnow
from app.extensions import db

# An order's state: waiting for Stripe's word; paid (its credits granted); failed; or
# expired (its Checkout session was left unpaid until Stripe closed it).
PENDING, PAID, FAILED, EXPIRED = "pending", "paid", "failed", "expired"
# How an order was placed: at Checkout by a holder, or off-session by auto top-up.
CHECKOUT, AUTO_TOPUP = "checkout", "auto_topup"
# Failed off-session payments in a row that turn auto top-up off.
TOPUP_FAILURES_ALLOWED = 3
# A dispute's state on its order: open (its amount taken back), then won (given back) or lost.
DISPUTE_OPEN, DISPUTE_WON, DISPUTE_LOST = "open", "won", "lost"


class PaymentOrder(db.Model):
    """Credits an organisation buys: what it gets, what it pays, and how far it got.

    ``amount`` is the credit granted once paid; ``fee`` what the operator adds on top;
    ``total_cents`` what Stripe is asked to charge (both, in cents of ``currency``), and
    what a paying event must say it charged. ``refunded_cents`` and ``taken_back`` follow
    Stripe's refunds (cumulative) and the credit they took back; ``dispute`` the state of
    a dispute of its charge.
    """

    __tablename__ = "payment_orders"
    __table_args__ = (
        Index("ix_payment_orders_account_id_created_at", "account_id", "created_at"),
        Index(
            "uq_payment_orders_auto_topup_pending",
            "account_id",
            unique=True,
            sqlite_where=text("kind = 'auto_topup' AND status = 'pending'"),
            postgresql_where=text("kind = 'auto_topup' AND status = 'pending'"),
        ),
        CheckConstraint("total_cents > 0", name="total_positive"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    kind: Mapped[str] = mapped_column(String(16), default=CHECKOUT)
    amount = mapped_column(Money, nullable=False)
    fee = mapped_column(Money, nullable=False, default=0)
    total_cents: Mapped[int] = mapped_column(Integer, nullable=False)
    currency: Mapped[str] = mapped_column(String(3), default="usd")
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    checkout_session_id: Mapped[str | None] = mapped_column(String(255), unique=True)
    payment_intent_id: Mapped[str | None] = mapped_column(String(255), unique=True)
    receipt_url: Mapped[str | None] = mapped_column(String(1000))
    refunded_cents: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    taken_back = mapped_column(Money, nullable=False, default=0)
    dispute: Mapped[str | None] = mapped_column(String(16))
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    paid_at = mapped_column(UTCDateTime, nullable=True)


class StripeEvent(db.Model):
    """A Stripe event applied: its id is recorded once, with what it did to the books."""

    __tablename__ = "stripe_events"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    type: Mapped[str] = mapped_column(String(100))
    order_id: Mapped[str | None] = mapped_column(String(40))
    received_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)


class RedemptionCode(db.Model):
    """A code worth ``amount`` USD, once, until ``expires_at``.

    The code itself is a secret shown once: only its SHA-256 ``digest`` is kept, and its
    public ``id`` (the part before the secret) names it in the ledger and the listings.
    """

    __tablename__ = "redemption_codes"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    amount = mapped_column(Money, nullable=False)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    expires_at = mapped_column(UTCDateTime, nullable=True)
    redeemed_by: Mapped[int | None] = mapped_column(ForeignKey("accounts.id"), nullable=True)
    redeemed_at = mapped_column(UTCDateTime, nullable=True)


class AutoTopup(db.Model):
    """An organisation's auto top-up: its saved card, and when and how much to buy.

    When the balance is below ``threshold``, one off-session payment of ``amount`` is
    made with the card saved at Checkout; ``armed`` is cleared when it is made, and set
    again once the balance is back at or above the threshold, so that one crossing
    makes one payment. ``failures`` counts failed payments in a row.
    """

    __tablename__ = "auto_topups"

    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    threshold = mapped_column(Money, nullable=True)
    amount = mapped_column(Money, nullable=True)
    customer_id: Mapped[str | None] = mapped_column(String(255))
    payment_method_id: Mapped[str | None] = mapped_column(String(255))
    armed: Mapped[bool] = mapped_column(Boolean, default=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
