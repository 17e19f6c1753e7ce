"""The API key record: a digest and a display prefix, never the value."""

from __future__ import annotations

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, false
from sqlalchemy.orm import Mapped, mapped_column

from app.budgets import BudgetCounters
from app.database import UTCDateTime, utcnow
from app.extensions import db

ACTIVE = "active"
REVOKED = "revoked"
# A deleted key keeps its row, so that its generations and per-key totals keep their
# key, and a request still running when it was deleted settles normally; its digest is
# replaced by a value no key hashes to, so the key itself is unknown (401) at once.
DELETED = "deleted"


class ApiKey(BudgetCounters, db.Model):
    """A named key of an account; deleting it erases its digest and keeps the row.

    A key may be limited to some models (``permitted_models``; None permits every model)
    and to a budget (``app.budgets.BudgetCounters``: an amount in USD a window, the
    month by default, which the API calls its ``monthly_limit``). For every key the
    window's spend is counted; for a key with a budget its open holds are reserved on
    its row too, and a hold is placed only while spent + reserved + the hold stay within
    the budget, in the hold's transaction (a key without a budget is only read by its
    holds, and reserves nothing).
    """

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), index=True
    )
    # The member the key belongs to (app.accounts.models.Membership); removing the
    # member revokes their keys, and the key's history stays theirs.
    member_id: Mapped[int] = mapped_column(ForeignKey("memberships.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    # sha256 of the whole key: the key has 256 random bits, so no salt or slow hash is
    # needed, and lookup stays one indexed equality.
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    display_prefix: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default=ACTIVE)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    last_used_at = mapped_column(UTCDateTime, nullable=True)
    permitted_models: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # The budget was set by an owner, an admin or the operator: the key's member may
    # lower it, not raise or remove it (app.accounts.budgets.checked_lock).
    budget_locked: Mapped[bool] = mapped_column(
        Boolean, nullable=False, default=False, server_default=false()
    )
