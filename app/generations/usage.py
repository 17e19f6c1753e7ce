"""What keys have spent, from their hourly usage rollups: GET /v1/key, the dashboard.

A key's spend is read from usage_rollups, one row per model and UTC hour, so that it
costs the same however long the key's history; a day and a month start on an hour.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import case, func, select

from app.accounts.models import Membership
from app.auth.models import ApiKey
from app.budgets import BudgetState, budget_state
from app.credits.balances import month_start
from app.credits.models import UsageRollup
from app.credits.settlement import hour_of
from app.database import utcnow
from app.extensions import db


@dataclass(frozen=True)
class KeyUsage:
    """A key's name and limits, its spend today and this month (UTC), in USD, and budgets.

    ``budget`` is the key's, ``member_budget`` its member's (which all their keys count
    against), each as its counters stand now.
    """

    name: str
    display_prefix: str
    permitted_models: list[str] | None
    spent_today: Decimal
    spent_this_month: Decimal
    budget: BudgetState
    member_budget: BudgetState


def key_usage(key_id: int, now: datetime | None = None) -> KeyUsage:
    """Return key ``key_id``'s limits, spend and budgets."""
    now = now or utcnow()
    key = db.session.get(ApiKey, key_id)
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    today = case((UsageRollup.hour >= day_start, UsageRollup.cost), else_=0)
    spent = db.session.execute(
        select(func.sum(today), func.sum(UsageRollup.cost)).where(
            *_key_hours(key.account_id, key_id, month_start(now))
        )
    ).one()
    member = db.session.get(Membership, key.member_id)
    usage = KeyUsage(
        name=key.name,
        display_prefix=key.display_prefix,
        permitted_models=key.permitted_models,
        spent_today=spent[0] or Decimal(0),
        spent_this_month=spent[1] or Decimal(0),
        budget=budget_state(key, now),
        member_budget=budget_state(member, now),
    )
    db.session.commit()
    return usage


def key_spend(key_id: int, *, since: datetime) -> Decimal:
    """Return what key ``key_id`` was charged from the UTC hour of ``since`` on."""
    account_id = db.session.scalar(select(ApiKey.account_id).where(ApiKey.id == key_id))
    spent = db.session.scalar(
        select(func.sum(UsageRollup.cost)).where(*_key_hours(account_id, key_id, hour_of(since)))
    )
    db.session.commit()
    return spent if spent is not None else Decimal(0)


def _key_hours(account_id: int, key_id: int, first_hour: datetime) -> tuple[Any, ...]:
    return (
        UsageRollup.account_id == account_id,
        UsageRollup.api_key_id == key_id,
        UsageRollup.hour >= first_hour,
    )
