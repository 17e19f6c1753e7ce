"""The outbox of alert events, the endpoints they go to and the log of their deliveries."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.database import UTCDateTime, utcnow
from app.extensions import db

WEBHOOK, EMAIL = "webhook", "email"
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


class AlertEvent(db.Model):
    """One event of an organisation, written in the transaction that caused it.

    ``data`` is JSON text whose money fields are in money units (a database trigger
    writes it); ``created`` is Unix seconds.
    """

    __tablename__ = "alert_events"
    __table_args__ = (Index("ix_alert_events_waiting", "fanned_out", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    type: Mapped[str] = mapped_column(String(40))
    data: Mapped[str] = mapped_column(Text)
    created: Mapped[int] = mapped_column(BigInteger)
    fanned_out: Mapped[bool] = mapped_column(Boolean, default=False)


class AlertEndpoint(db.Model):
    """Where an organisation's events go: a webhook URL or an e-mail address.

    A webhook's signing secret is kept sealed (encrypted with a key derived from
    SECRET_KEY), never in clear: signing needs it back, so it cannot be hashed. So is
    the user and password a webhook URL carried (``user:pass@``): ``target`` keeps the
    URL without them, and they are sent as Basic auth.
    """

    __tablename__ = "alert_endpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    kind: Mapped[str] = mapped_column(String(8))
    target: Mapped[str] = mapped_column(String(2000))
    sealed_secret: Mapped[str | None] = mapped_column(Text, nullable=True)
    sealed_userinfo: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    removed_at = mapped_column(UTCDateTime, nullable=True)

    @property
    def shown_target(self) -> str:
        """Return the target as pages, commands and the log show it: credentials as ``***``."""
        if not self.sealed_userinfo:
            return self.target
        scheme, _, rest = self.target.partition("://")
        return f"{scheme}://***@{rest}"


class AlertDelivery(db.Model):
    """One event's delivery to one endpoint: its attempts, status and next try."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "endpoint_id", name="uq_alert_delivery_once"),
        Index("ix_alert_deliveries_due", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(ForeignKey("alert_events.id"))
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("alert_endpoints.id"))
    status: Mapped[str] = mapped_column(String(10), default=PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at = mapped_column(UTCDateTime, nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    delivered_at = mapped_column(UTCDateTime, nullable=True)
