"""An account's usage: totals per model, key and day from its rollups; its generations.

Totals, the chart and the model choices read usage_rollups (one row per key, model and
UTC hour), so that their cost follows the hours asked for, not the generations in
them; a filter's dates map onto whole hours. The generations list and the CSV read the
raw records in pages that start after the last row seen, newest first by (time, id).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import ColumnElement, Select, String, case, func, select

from app.auth.models import DELETED, ApiKey
from app.credits.ledger import hour_of
from app.credits.models import NO_KEY, UsageRollup
from app.dashboard.pages import Cursor, KeysetPage, fetch_keyset_page, keyset_batches
from app.extensions import db
from app.generations.models import Generation

# A deleted key's generations keep its name, marked, so that past spend stays attributed.
KEY_NAME = case((ApiKey.state == DELETED, ApiKey.name + " (deleted)"), else_=ApiKey.name)
# The generations listed newest first, each page after the last row of the one before.
NEWEST_FIRST = (Generation.created_at, Generation.id)
# Rows of the CSV read per query: each batch is a read of its own.
CSV_BATCH = 1000


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


def _conditions(
    usage: UsageFilter, key: ColumnElement[Any], model: Any, moment: Any
) -> list[ColumnElement[bool]]:
    """Return ``usage`` as conditions on a table's key, model and time columns."""
    conditions = []
    if usage.key_id is not None:
        conditions.append(key == usage.key_id)
    if usage.model:
        conditions.append(model == usage.model)
    if usage.since:
        conditions.append(moment >= _day_start(usage.since))
    if usage.until:
        conditions.append(moment < _day_start(usage.until + timedelta(days=1)))
    return conditions


def _rolled_up(statement: Select[Any], account_id: int, usage: UsageFilter) -> Select[Any]:
    # A day starts on an hour: the filter's dates cover whole rollup rows.
    conditions = _conditions(usage, UsageRollup.api_key_id, UsageRollup.model, UsageRollup.hour)
    return statement.where(UsageRollup.account_id == account_id, *conditions)


def _recorded(statement: Select[Any], account_id: int, usage: UsageFilter) -> Select[Any]:
    conditions = _conditions(usage, Generation.api_key_id, Generation.model, Generation.created_at)
    return statement.where(Generation.account_id == account_id, *conditions)


def _generation_rows(account_id: int, usage: UsageFilter, *columns: Any) -> Select[Any]:
    statement = select(*columns, KEY_NAME.label("key_name")).outerjoin(
        ApiKey, ApiKey.id == Generation.api_key_id
    )
    return _recorded(statement, account_id, usage)


def generations_page(
    account_id: int,
    usage: UsageFilter,
    *,
    before: Cursor | None = None,
    after: Cursor | None = None,
) -> KeysetPage[Any]:
    """Return the page of the account's generations older than ``before`` or newer than ``after``.

    Neither: the newest. Newest first, by time then id.
    """
    statement = _generation_rows(account_id, usage, Generation)
    return fetch_keyset_page(
        statement, NEWEST_FIRST, _position_of_record, before=before, after=after
    )


def _position_of_record(row: Any) -> Cursor:
    return Cursor(row[0].created_at, row[0].id)


def _position_of_fields(row: Any) -> Cursor:
    return Cursor(row.created_at, row.id)


# The CSV's columns of a generation, read as values: a batch outlives its read.
CSV_FIELDS = (
    Generation.created_at,
    Generation.id,
    Generation.model,
    Generation.api,
    Generation.prompt_tokens,
    Generation.cached_tokens,
    Generation.completion_tokens,
    Generation.reasoning_tokens,
    Generation.cost,
    Generation.latency_ms,
    Generation.status,
    Generation.streamed,
    Generation.estimated,
)


def iter_generations(account_id: int, usage: UsageFilter) -> Iterator[Any]:
    """Yield every filtered generation's CSV fields, newest first by (time, id).

    A batch at a time, each read on its own: memory stays that of one batch however long
    the export, and no read stays open while the rows are sent.
    """
    statement = _generation_rows(account_id, usage, *CSV_FIELDS)
    yield from keyset_batches(statement, NEWEST_FIRST, _position_of_fields, CSV_BATCH)


def _totals(account_id: int, usage: UsageFilter, label: Any, *group: Any) -> list[UsageTotal]:
    cost = func.sum(UsageRollup.cost)
    statement = (
        select(
            label,
            func.sum(UsageRollup.requests),
            func.sum(UsageRollup.prompt_tokens),
            func.sum(UsageRollup.completion_tokens),
            cost,
        )
        .select_from(UsageRollup)
        .outerjoin(ApiKey, ApiKey.id == UsageRollup.api_key_id)
    )
    statement = _rolled_up(statement, account_id, usage).group_by(*group).order_by(cost.desc())
    totals = [
        UsageTotal(str(r[0]), int(r[1]), int(r[2]), int(r[3]), r[4] or Decimal(0))
        for r in db.session.execute(statement)
    ]
    db.session.commit()
    return totals


def totals_by_model(account_id: int, usage: UsageFilter) -> list[UsageTotal]:
    """Return requests, tokens and cost per model, costliest first."""
    return _totals(account_id, usage, UsageRollup.model, UsageRollup.model)


def totals_by_key(account_id: int, usage: UsageFilter) -> list[UsageTotal]:
    """Return requests, tokens and cost per key (unkeyed records together), costliest first."""
    # Charges made without a key are filed under NO_KEY, which names no key's row.
    label = func.coalesce(KEY_NAME, "(no key)")
    return _totals(account_id, usage, label, UsageRollup.api_key_id, KEY_NAME)


def daily_spend(account_id: int, *, days: int, today: date) -> dict[tuple[date, str], Decimal]:
    """Return the cost per (UTC day, model) over the ``days`` days ending ``today``."""
    first = today - timedelta(days=days - 1)
    # SQLite's date() answers text, PostgreSQL's a date: both print as YYYY-MM-DD.
    day = func.date(UsageRollup.hour, type_=String)
    statement = _rolled_up(
        select(day, UsageRollup.model, func.sum(UsageRollup.cost)),
        account_id,
        UsageFilter(since=first, until=today),
    ).group_by(day, UsageRollup.model)
    spend = {
        (date.fromisoformat(str(row[0])[:10]), row[1]): row[2]
        for row in db.session.execute(statement)
    }
    db.session.commit()
    return spend


def spend_by_key_since(account_id: int, since: datetime) -> dict[int, Decimal]:
    """Return each key's spend from the UTC hour of ``since`` on."""
    statement = (
        select(UsageRollup.api_key_id, func.sum(UsageRollup.cost))
        .where(UsageRollup.account_id == account_id, UsageRollup.hour >= hour_of(since))
        .where(UsageRollup.api_key_id != NO_KEY)
        .group_by(UsageRollup.api_key_id)
    )
    spend = {row[0]: row[1] for row in db.session.execute(statement)}
    db.session.commit()
    return spend


def account_models(account_id: int) -> list[str]:
    """Return the models the account has used, by name."""
    statement = (
        select(UsageRollup.model)
        .where(UsageRollup.account_id == account_id)
        .distinct()
        .order_by(UsageRollup.model)
    )
    models = list(db.session.scalars(statement))
    db.session.commit()
    return models
