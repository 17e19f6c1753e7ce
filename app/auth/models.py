"""The API key record: a digest and a display prefix, never the value."""

from __future__ import annotations

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.database import UTCDateTime, utcnow
from app.extensions import db

ACTIVE = "active"
REVOKED = "revoked"


class ApiKey(db.Model):
    """A named key of an account; deleting it removes the row."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(100))
    # sha256 of the whole key: the key has 256 random bits, so no salt or slow hash is
    # needed, and lookup stays one indexed equality.
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    display_prefix: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default=ACTIVE)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    last_used_at = mapped_column(UTCDateTime, nullable=True)
