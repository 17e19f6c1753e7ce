"""Read-only views of the credit held for requests in flight, for the operator's metrics."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import func, select

from app.credits.models import OPEN, Hold
from app.extensions import db


@dataclass(frozen=True)
class OpenHolds:
    """How many holds are open across all accounts, and the USD they hold."""

    count: int
    amount: Decimal


def open_holds_summary() -> OpenHolds:
    """Count the open holds and sum what they hold."""
    count, amount = db.session.execute(
        select(func.count(), func.sum(Hold.amount)).where(Hold.status == OPEN)
    ).one()
    db.session.commit()
    return OpenHolds(count=count, amount=amount or Decimal(0))
