"""What keys have spent, from their generations' records: GET /v1/key, the dashboard."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import func, select

from app.auth.models import ApiKey
from app.credits.ledger import month_start
from app.database import utcnow
from app.extensions import db
from app.generations.models import Generation


@dataclass(frozen=True)
class KeyUsage:
    """A key's name and limits, and its spend today and this month (UTC), in USD."""

    name: str
    display_prefix: str
    permitted_models: list[str] | None
    monthly_limit: Decimal | None
    spent_today: Decimal
    spent_this_month: Decimal

    @property
    def limit_remaining(self) -> Decimal | None:
        """What the key may still spend this month; None when it has no monthly limit."""
        if self.monthly_limit is None:
            return None
        return max(self.monthly_limit - self.spent_this_month, Decimal(0))


def key_usage(key_id: int, now: datetime | None = None) -> KeyUsage:
    """Return key ``key_id``'s limits and spend."""
    now = now or utcnow()
    key = db.session.get(ApiKey, key_id)
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    usage = KeyUsage(
        name=key.name,
        display_prefix=key.display_prefix,
        permitted_models=key.permitted_models,
        monthly_limit=key.monthly_limit,
        spent_today=key_spend(key_id, since=day_start),
        spent_this_month=key_spend(key_id, since=month_start(now)),
    )
    db.session.commit()
    return usage


def key_spend(key_id: int, *, since: datetime) -> Decimal:
    """Return what the generations of key ``key_id`` were charged since ``since``."""
    spent = _spent_since(key_id, since)
    db.session.commit()
    return spent


def _spent_since(key_id: int, since: datetime) -> Decimal:
    total = db.session.scalar(
        select(func.sum(Generation.cost)).where(
            Generation.api_key_id == key_id, Generation.created_at >= since
        )
    )
    return total if total is not None else Decimal(0)
