"""An account's usage: its generations filtered, totalled per model and key, and per day."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, String, case, func, select

from app.auth.models import DELETED, ApiKey
from app.dashboard.pages import Page, fetch_page
from app.extensions import db
from app.generations.models import Generation

# A deleted key's generations keep its name, marked, so that past spend stays attributed.
KEY_NAME = case((ApiKey.state == DELETED, ApiKey.name + " (deleted)"), else_=ApiKey.name)


@dataclass(frozen=True)
class UsageFilter:
    """Which generations to show: by key, model, and UTC dates (both inclusive)."""

    key_id: int | None = None
    model: str | None = None
    since: date | None = None
    until: date | None = None


@dataclass(frozen=True)
class UsageTotal:
    """Requests, tokens and cost of one model or key."""

    label: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _filtered(statement: Select[Any], account_id: int, usage: UsageFilter) -> Select[Any]:
    statement = statement.where(Generation.account_id == account_id)
    if usage.key_id is not None:
        statement = statement.where(Generation.api_key_id == usage.key_id)
    if usage.model:
        statement = statement.where(Generation.model == usage.model)
    if usage.since:
        statement = statement.where(Generation.created_at >= _day_start(usage.since))
    if usage.until:
        statement = statement.where(
            Generation.created_at < _day_start(usage.until + timedelta(days=1))
        )
    return statement


def _generation_rows(account_id: int, usage: UsageFilter) -> Select[Any]:
    statement = select(Generation, KEY_NAME.label("key_name")).outerjoin(
        ApiKey, ApiKey.id == Generation.api_key_id
    )
    return _filtered(statement, account_id, usage).order_by(
        Generation.created_at.desc(), Generation.id.desc()
    )


def generations_page(account_id: int, usage: UsageFilter, number: int) -> Page[Any]:
    """Return page ``number`` of the account's generations, newest first."""
    return fetch_page(_generation_rows(account_id, usage), number)


def iter_generations(account_id: int, usage: UsageFilter) -> Iterator[Any]:
    """Yield every filtered generation, newest first, a batch at a time (for CSV export)."""
    statement = _generation_rows(account_id, usage).execution_options(yield_per=500)
    yield from db.session.execute(statement)


def _totals(account_id: int, usage: UsageFilter, label: Any, *group: Any) -> list[UsageTotal]:
    cost = func.sum(Generation.cost)
    statement = (
        select(
            label,
            func.count(Generation.id),
            func.coalesce(func.sum(Generation.prompt_tokens), 0),
            func.coalesce(func.sum(Generation.completion_tokens), 0),
            cost,
        )
        .select_from(Generation)
        .outerjoin(ApiKey, ApiKey.id == Generation.api_key_id)
    )
    statement = _filtered(statement, account_id, usage).group_by(*group).order_by(cost.desc())
    return [
        UsageTotal(str(r[0]), r[1], int(r[2]), int(r[3]), r[4] or Decimal(0))
        for r in db.session.execute(statement)
    ]


def totals_by_model(account_id: int, usage: UsageFilter) -> list[UsageTotal]:
    """Return requests, tokens and cost per model, costliest first."""
    return _totals(account_id, usage, Generation.model, Generation.model)


def totals_by_key(account_id: int, usage: UsageFilter) -> list[UsageTotal]:
    """Return requests, tokens and cost per key (unkeyed records together), costliest first."""
    label = func.coalesce(KEY_NAME, "(no key)")
    return _totals(account_id, usage, label, Generation.api_key_id, KEY_NAME)


def daily_spend(account_id: int, *, days: int, today: date) -> dict[tuple[date, str], Decimal]:
    """Return the cost per (UTC day, model) over the ``days`` days ending ``today``."""
    first = today - timedelta(days=days - 1)
    # SQLite's date() answers text, PostgreSQL's a date: both print as YYYY-MM-DD.
    day = func.date(Generation.created_at, type_=String)
    statement = _filtered(
        select(day, Generation.model, func.sum(Generation.cost)),
        account_id,
        UsageFilter(since=first, until=today),
    ).group_by(day, Generation.model)
    return {
        (date.fromisoformat(str(row[0])[:10]), row[1]): row[2]
        for row in db.session.execute(statement)
    }


def spend_by_key_since(account_id: int, since: datetime) -> dict[int, Decimal]:
    """Return each key's spend since ``since``."""
    statement = (
        select(Generation.api_key_id, func.sum(Generation.cost))
        .where(Generation.account_id == account_id, Generation.created_at >= since)
        .where(Generation.api_key_id.is_not(None))
        .group_by(Generation.api_key_id)
    )
    return {row[0]: row[1] for row in db.session.execute(statement)}


def account_models(account_id: int) -> list[str]:
    """Return the models the account has used, by name."""
    statement = (
        select(Generation.model)
        .where(Generation.account_id == account_id)
        .distinct()
        .order_by(Generation.model)
    )
    return list(db.session.scalars(statement))
