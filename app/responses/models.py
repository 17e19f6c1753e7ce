"""Stored responses: what ``previous_response_id``, retrieval and input_items read."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from app.database import UTCDateTime
from app.extensions import db


class StoredResponse(db.Model):
    """A response created with ``store``, kept for its account until ``expires_at``.

    ``response`` is the Response object as the caller got it and ``input_items`` the
    items of its request, both JSON; they are the caller's content, never logged.
    ``chain_length`` counts the responses of its chain, itself included, and
    ``chain_bytes`` what they store, so that a continuation is bounded by one row.
    """

    __tablename__ = "stored_responses"
    __table_args__ = (Index("ix_stored_responses_expires_at", "expires_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"))
    previous_response_id: Mapped[str | None] = mapped_column(String(64))
    chain_length: Mapped[int] = mapped_column(Integer)
    chain_bytes: Mapped[int] = mapped_column(BigInteger)
    input_items = mapped_column(LargeBinary, nullable=False)
    response = mapped_column(LargeBinary, nullable=False)
    created_at = mapped_column(UTCDateTime, nullable=False)
    expires_at = mapped_column(UTCDateTime, nullable=False)
