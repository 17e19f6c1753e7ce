"""What an account signs in to the dashboard with: its password hash, its invites."""

from __future__ import annotations

from sqlalchemy import ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.database import UTCDateTime, utcnow
from app.extensions import db


class AccountPassword(db.Model):
    """An account's dashboard password, as an Argon2id hash; no row, no password sign-in."""

    __tablename__ = "account_passwords"

    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True
    )
    password_hash: Mapped[str] = mapped_column(String(255))
    updated_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)


class AccountInvite(db.Model):
    """A one-time link where an account holder sets a password.

    Only the sha256 of the link's token is stored: the token has 256 random bits, so a
    leaked table gives nothing to guess from, and lookup stays one indexed equality.
    """

    __tablename__ = "account_invites"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), index=True
    )
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    expires_at = mapped_column(UTCDateTime, nullable=False)
    used_at = mapped_column(UTCDateTime, nullable=True)
