"""Usage rollups against the raw generations: recomputed (``flask usage rebuild``), checked.

Settlements keep the rollups as they go; this recomputes them, for generations imported
or repaired by hand. An account's hours are rebuilt a span at a time, each span in a
transaction of its own that first takes the account's row, as every settlement does
before it touches a rollup: no settlement of the account is half-counted meanwhile,
and other accounts' requests never wait. Only the hours whose generations are all kept
(``retention.first_kept_hour``) are recomputed; older rollups stay as they are, the only
record of those hours.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    Select,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    type_coerce,
    union_all,
)
from sqlalchemy.engine import Connection

from app.credits.accounts import AccountNotFound
from app.credits.models import NO_KEY, Account, UsageRollup
from app.credits.settlement import hour_of
from app.database import utc_hour, write_transaction
from app.extensions import db
from app.generations.models import Generation
from app.generations.retention import first_kept_hour
from app.money import UNITS_PER_USD

# The hours one transaction of a rebuild recomputes.
REBUILD_SPAN = timedelta(days=1)
ROLLUP_COLUMNS = (
    "account_id",
    "api_key_id",
    "model",
    "hour",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost",
    "shortfall",
)


@dataclass(frozen=True)
class RebuildReport:
    """What a rebuild recomputed: accounts, rollup rows written, generations counted."""

    accounts: int
    rollups: int
    generations: int
    first_hour: datetime | None


def rebuild_rollups(*, account_id: int | None = None) -> RebuildReport:
    """Recompute the usage rollups of ``account_id`` (None: every account) from their generations.

    Idempotent: the rollups of the hours recomputed become exactly the sums of the
    generations recorded in them, whatever they were before.

    :raise AccountNotFound: there is no account ``account_id``.
    """
    first = first_kept_hour()
    query = select(Account.id).order_by(Account.id)
    if account_id is not None:
        query = query.where(Account.id == account_id)
    account_ids = list(db.session.scalars(query))
    db.session.commit()
    if account_id is not None and not account_ids:
        raise AccountNotFound(f"no account with id {account_id}")
    rollups = generations = 0
    for each in account_ids:
        written, counted = _rebuild_account(each, first)
        rollups, generations = rollups + written, generations + counted
    return RebuildReport(len(account_ids), rollups, generations, first)


def _rebuild_account(account_id: int, first: datetime | None) -> tuple[int, int]:
    """Rebuild the account's kept hours a span at a time; return rollups written, generations."""
    span = _hours_recorded(account_id, first)
    if span is None:
        return 0, 0
    start, end = span
    rollups = generations = 0
    while start < end:
        stop = min(start + REBUILD_SPAN, end)
        written, counted = write_transaction(
            lambda connection, start=start, stop=stop: _rebuild_span(
                connection, account_id, start, stop
            )
        )
        rollups, generations, start = rollups + written, generations + counted, stop
    return rollups, generations


def _hours_recorded(account_id: int, first: datetime | None) -> tuple[datetime, datetime] | None:
    """Return the hours from the account's first kept record (or rollup) past its last."""
    generations = db.session.execute(
        select(func.min(Generation.created_at), func.max(Generation.created_at)).where(
            Generation.account_id == account_id
        )
    ).one()
    rollups = db.session.execute(
        select(func.min(UsageRollup.hour), func.max(UsageRollup.hour)).where(
            UsageRollup.account_id == account_id
        )
    ).one()
    db.session.commit()
    starts = [moment for moment in (generations[0], rollups[0]) if moment is not None]
    ends = [moment for moment in (generations[1], rollups[1]) if moment is not None]
    if not starts:
        return None
    start = hour_of(min(starts))
    if first is not None:
        start = max(start, first)
    end = hour_of(max(ends)) + timedelta(hours=1)
    return (start, end) if start < end else None


def _rebuild_span(
    connection: Connection, account_id: int, start: datetime, stop: datetime
) -> tuple[int, int]:
    """Replace the account's rollups of the hours [start, stop) by its generations' sums."""
    # The account's row first, as a settlement takes it before its rollup.
    connection.execute(select(Account.id).where(Account.id == account_id).with_for_update())
    connection.execute(
        delete(UsageRollup).where(
            UsageRollup.account_id == account_id,
            UsageRollup.hour >= start,
            UsageRollup.hour < stop,
        )
    )
    sums = _sums_by_hour(account_id, start, stop)
    # SQLAlchemy keeps an INSERT's count of rows only when asked (psycopg's is not read).
    rebuilt = insert(UsageRollup).from_select(ROLLUP_COLUMNS, sums)
    written = connection.execute(rebuilt.execution_options(preserve_rowcount=True)).rowcount
    counted = connection.execute(
        select(func.coalesce(func.sum(UsageRollup.requests), 0)).where(
            UsageRollup.account_id == account_id,
            UsageRollup.hour >= start,
            UsageRollup.hour < stop,
        )
    ).scalar_one()
    return written, int(counted)


def _sums_by_hour(account_id: int, start: datetime, stop: datetime) -> Select[Any]:
    """Return the SELECT of the account's generations in [start, stop), summed per rollup row."""
    hour = utc_hour(Generation.created_at)
    key = func.coalesce(Generation.api_key_id, NO_KEY)
    return (
        select(
            Generation.account_id,
            key,
            Generation.model,
            hour,
            func.count(),
            func.sum(Generation.prompt_tokens),
            func.sum(Generation.cached_tokens),
            func.sum(Generation.completion_tokens),
            func.sum(Generation.reasoning_tokens),
            func.sum(Generation.cost),
            func.sum(Generation.shortfall),
        )
        .where(
            Generation.account_id == account_id,
            Generation.created_at >= start,
            Generation.created_at < stop,
        )
        .group_by(Generation.account_id, key, Generation.model, hour)
    )


# The sums a rollup keeps, and what each is called in a report.
SUMS = {
    "requests": "requests",
    "prompt_tokens": "prompt tokens",
    "cached_tokens": "cached tokens",
    "completion_tokens": "completion tokens",
    "reasoning_tokens": "reasoning tokens",
    "cost": "cost",
    "shortfall": "shortfall",
}
MONEY_SUMS = ("cost", "shortfall")


def rollup_mismatches(
    account_ids: list[int], first_hour: datetime | None
) -> Iterator[tuple[int, str, str]]:
    """Yield (account, subject, problem) for each rollup that differs from its generations.

    The accounts' rollups of the hours from ``first_hour`` (None: all of them) whose
    generations are all kept, against the sums of those generations. SQL compares
    them; only the rows that differ are read.
    """
    kept = first_kept_hour()
    if kept is not None:
        first_hour = kept if first_hour is None else max(first_hour, kept)
    both = union_all(
        _raw_side(account_ids, first_hour), _rolled_side(account_ids, first_hour)
    ).subquery()
    raw = [func.sum(both.c[f"raw_{name}"]) for name in SUMS]
    rolled = [func.sum(both.c[f"rolled_{name}"]) for name in SUMS]
    differs = or_(*(mine != theirs for mine, theirs in zip(rolled, raw, strict=True)))
    row_key = (both.c.account_id, both.c.api_key_id, both.c.model, both.c.hour)
    query = select(*row_key, *raw, *rolled).group_by(*row_key).having(differs)
    for row in db.session.execute(query):
        yield _mismatch(row[:4], row[4 : 4 + len(SUMS)], row[4 + len(SUMS) :])


def _raw_side(account_ids: list[int], first_hour: datetime | None) -> Select[Any]:
    """Return the generations' sums per rollup row, beside zeros for the rollup's."""
    g = Generation
    hour = utc_hour(g.created_at)
    key = func.coalesce(g.api_key_id, NO_KEY)
    sums = [
        func.count(),
        *(func.sum(_units(getattr(g, name))) for name in list(SUMS)[1:]),
    ]
    zeros = [_zero() for _ in SUMS]
    conditions = [g.account_id.in_(account_ids)]
    if first_hour is not None:
        conditions.append(g.created_at >= first_hour)
    return (
        select(
            g.account_id,
            key.label("api_key_id"),
            g.model,
            hour.label("hour"),
            *_named(sums, "raw"),
            *_named(zeros, "rolled"),
        )
        .where(*conditions)
        .group_by(g.account_id, key, g.model, hour)
    )


def _rolled_side(account_ids: list[int], first_hour: datetime | None) -> Select[Any]:
    """Return the rollups' sums, beside zeros for the generations'."""
    r = UsageRollup
    zeros = [_zero() for _ in SUMS]
    sums = [_units(getattr(r, name)) for name in SUMS]
    conditions = [r.account_id.in_(account_ids)]
    if first_hour is not None:
        conditions.append(r.hour >= first_hour)
    return select(
        r.account_id, r.api_key_id, r.model, r.hour, *_named(zeros, "raw"), *_named(sums, "rolled")
    ).where(*conditions)


def _units(column: Any) -> Any:
    """``column`` as the integer it is stored as (money in units of 1e-10 USD)."""
    return type_coerce(column, BigInteger)


def _zero() -> Any:
    return literal(0, BigInteger)


def _named(columns: list[Any], side: str) -> list[Any]:
    return [column.label(f"{side}_{name}") for column, name in zip(columns, SUMS, strict=True)]


def _mismatch(row_key: tuple, raw: tuple, rolled: tuple) -> tuple[int, str, str]:
    """Word one rollup's difference from its generations, sum by sum."""
    account_id, key_id, model, hour = row_key
    subject = f"usage rollup of account {account_id}, key {key_id}, model {model}, hour {hour}"
    differences = [
        f"{SUMS[name]} {_shown(name, mine)} but its generations sum to {_shown(name, theirs)}"
        for name, theirs, mine in zip(SUMS, raw, rolled, strict=True)
        if theirs != mine
    ]
    return account_id, subject, "; ".join(differences)


def _shown(name: str, value: int | None) -> str:
    value = value or 0
    return f"${Decimal(value) / UNITS_PER_USD:f}" if name in MONEY_SUMS else str(value)
