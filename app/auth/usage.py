"""What a key may do and has spent: the body of GET /v1/key."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from app.auth.keys import key_spend
from app.auth.models import ApiKey
from app.credits.ledger import month_start
from app.database import utcnow
from app.extensions import db


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
