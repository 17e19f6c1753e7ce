"""An account's usage: totals per model, key and day from its rollups; its generations.

Totals (over the last 30 days unless dates are chosen) and the chart read usage_rollups
(one row per key, model and UTC hour), so that their cost follows the hours asked for,
not the generations in them; a filter's dates map onto whole hours. The generations list
and the CSV read the raw records in pages that start after the last row seen, newest
first by (time, id).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    String,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
    type_coerce,
)

from app.accounts.models import Membership, Person
from app.auth.models import DELETED, ApiKey
from app.credits.models import NO_KEY, UsageRollup
from app.credits.settlement import hour_of
from app.dashboard.pages import (
    Cursor,
    KeysetBatches,
    KeysetPage,
    fetch_keyset_page,
    keyset_batches,
    keyset_statements,
)
from app.database import utc_iso_text
from app.extensions import db
from app.generations.models import Generation
from app.money import UNITS_PER_USD

# A deleted key's generations keep its name, marked, so that past spend stays attributed.
KEY_NAME = case((ApiKey.state == DELETED, ApiKey.name + " (deleted)"), else_=ApiKey.name)
# The generations listed newest first, each page after the last row of the one before.
NEWEST_FIRST = (Generation.created_at, Generation.id)
# Rows of the CSV read per query: each batch is a read of its own.
CSV_BATCH = 1000


@dataclass(frozen=True)
class UsageFilter:
    """Which generations to show: by key, model, and UTC dates (both inclusive).

    ``key_ids`` narrows everything to those keys (a member sees only their own).
    """

    key_id: int | None = None
    model: str | None = None
    since: date | None = None
    until: date | None = None
    key_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class UsageTotal:
    """Requests, tokens and cost of one model or key."""

    label: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost: Decimal


def with_dates(usage: UsageFilter, *, days: int, today: date) -> UsageFilter:
    """Return ``usage``, over the ``days`` days ending ``today`` if it names no dates.

    Totals cover a window unless asked for more: what they cost follows the hours in it.
    """
    if usage.since or usage.until:
        return usage
    return replace(usage, since=today - timedelta(days=days - 1), until=today)


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


def _conditions(
    usage: UsageFilter, key: ColumnElement[Any], model: Any, moment: Any
) -> list[ColumnElement[bool]]:
    """Return ``usage`` as conditions on a table's key, model and time columns."""
    conditions = []
    if usage.key_id is not None:
        conditions.append(key == usage.key_id)
    if usage.key_ids is not None:
        conditions.append(key.in_(usage.key_ids))
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


def _position_of_fields(row: Sequence[Any]) -> Cursor:
    return Cursor(datetime.fromisoformat(row[0]), row[1])


def _units_text(units: Any) -> ColumnElement[str]:
    """Money units as USD text, spelled as ``app.money.usd_text`` spells them (units >= 0).

    In SQL both databases share: the whole dollars, then the fraction's ten digits
    without their trailing zeros (1e10 is added to keep its leading zeros, then dropped).
    """
    whole, fraction = units // UNITS, units % UNITS
    digits = func.rtrim(func.substr(cast(fraction + UNITS, String), 2), "0")
    return cast(whole, String) + case((fraction == 0, ""), else_="." + digits)


def _csv_middle(*columns: Any) -> ColumnElement[str]:
    """Return the columns' texts as one, comma separated (none of them needs quoting)."""
    text = columns[0]
    for column in columns[1:]:
        text = text + "," + column
    return text


def _text(column: Any) -> ColumnElement[str]:
    return cast(column, String)


UNITS = literal_column(str(UNITS_PER_USD), BigInteger)
# The CSV's columns of a generation, each spelled by the database where it needs no
# quoting, in both databases' SQL: the time as ISO 8601 text, the integers and the cost
# (in money units) as one text, the two flags as one. The texts that may need quoting
# (id, model, api, status) and the key's id are read as stored.
CSV_FIELDS = (
    utc_iso_text(Generation.created_at).label("time"),
    Generation.id,
    Generation.model,
    Generation.api,
    Generation.api_key_id,
    _csv_middle(
        _text(Generation.prompt_tokens),
        _text(Generation.cached_tokens),
        _text(Generation.completion_tokens),
        _text(Generation.reasoning_tokens),
        _units_text(type_coerce(Generation.cost, BigInteger)),
        _text(Generation.latency_ms),
    ).label("counts"),
    Generation.status,
    case(
        (Generation.streamed, case((Generation.estimated, "true,true"), else_="true,false")),
        (Generation.estimated, "false,true"),
        else_="false,false",
    ).label("flags"),
)


@functools.lru_cache(maxsize=32)
def _csv_statements(
    has_key: bool, has_keys: bool, has_model: bool, since: bool, until: bool
) -> KeysetBatches:
    """Return the CSV's batch statements for a filter of this shape, its values bound by name.

    Built once a shape: the driver's form of each is compiled once (see pages.keyset_batches).
    """
    conditions = [Generation.account_id == bindparam("account_id")]
    if has_key:
        conditions.append(Generation.api_key_id == bindparam("key_id"))
    if has_keys:
        conditions.append(Generation.api_key_id.in_(bindparam("key_ids", expanding=True)))
    if has_model:
        conditions.append(Generation.model == bindparam("model"))
    if since:
        conditions.append(Generation.created_at >= bindparam("since"))
    if until:
        conditions.append(Generation.created_at < bindparam("until"))
    return keyset_statements(select(*CSV_FIELDS).where(*conditions), NEWEST_FIRST)


def _csv_parameters(account_id: int, usage: UsageFilter) -> dict[str, Any]:
    values = {
        "account_id": account_id,
        "key_id": usage.key_id,
        "key_ids": usage.key_ids,
        "model": usage.model or None,
        "since": _day_start(usage.since) if usage.since else None,
        "until": _day_start(usage.until + timedelta(days=1)) if usage.until else None,
    }
    return {name: value for name, value in values.items() if value is not None}


def generation_batches(account_id: int, usage: UsageFilter) -> Iterator[Sequence[Any]]:
    """Yield every filtered generation's CSV fields, newest first by (time, id), in batches.

    Each batch is a read of its own: memory stays that of one batch however long the
    export, and no read stays open while the rows are sent.
    """
    parameters = _csv_parameters(account_id, usage)
    statements = _csv_statements(
        *(name in parameters for name in ("key_id", "key_ids", "model", "since", "until"))
    )
    yield from keyset_batches(statements, parameters, _position_of_fields, CSV_BATCH)


def key_names(account_id: int) -> dict[int, str]:
    """Return the name of each of the account's keys, deleted ones marked, by id."""
    names = dict(
        db.session.execute(select(ApiKey.id, KEY_NAME).where(ApiKey.account_id == account_id)).all()
    )
    db.session.commit()
    return names


@dataclass(frozen=True)
class RolledUp:
    """An account's rollups under a filter, summed per UTC day, key and model: one read.

    The usage page's totals per model, key and member, and its chart, are all summed
    from these few rows (days x keys x models) rather than each by a read of its own of
    the rollups (days x 24 hours x keys x models).
    """

    # (day, key id, model, requests, prompt tokens, completion tokens, cost)
    sums: list[tuple[date, int, str, int, int, int, Decimal]]
    # Each key's name and its member's e-mail, by key id.
    holders: dict[int, tuple[str, str | None]]

    def by_model(self) -> list[UsageTotal]:
        """Return requests, tokens and cost per model, costliest first."""
        return _costliest_first((row[2], row) for row in self.sums)

    def by_key(self) -> list[UsageTotal]:
        """Return requests, tokens and cost per key (unkeyed records together), costliest first."""
        # Charges made without a key are filed under NO_KEY, which names no key's row.
        return _costliest_first(
            ((row[1], self.holders.get(row[1], (NO_KEY_LABEL, None))[0]), row) for row in self.sums
        )

    def by_member(self) -> list[UsageTotal]:
        """Return requests, tokens and cost per member (by their keys), costliest first.

        A removed member's spend stays theirs; charges made without a key are together.
        """
        return _costliest_first(
            (self.holders.get(row[1], (None, None))[1] or NO_KEY_LABEL, row) for row in self.sums
        )

    def daily_spend(self) -> dict[tuple[date, str], Decimal]:
        """Return the cost per (UTC day, model)."""
        spend: dict[tuple[date, str], Decimal] = {}
        for day, _, model, *_, cost in self.sums:
            spend[day, model] = spend.get((day, model), Decimal(0)) + cost
        return spend


NO_KEY_LABEL = "(no key)"


def _costliest_first(grouped: Iterator[tuple[Any, tuple]]) -> list[UsageTotal]:
    """Sum the rows under their groups; return a total per group, costliest first.

    A group is its label, or (key id, label): two keys of one name stay apart.
    """
    sums: dict[Any, list] = {}
    for group, (_, _, _, requests, prompt, completion, cost) in grouped:
        total = sums.setdefault(group, [0, 0, 0, Decimal(0)])
        total[0] += requests
        total[1] += prompt
        total[2] += completion
        total[3] += cost
    totals = [
        UsageTotal(group if isinstance(group, str) else group[1], *total)
        for group, total in sums.items()
    ]
    return sorted(totals, key=lambda total: (-total.cost, total.label))


def rolled_up(account_id: int, usage: UsageFilter) -> RolledUp:
    """Return the account's rollups under ``usage``, summed per UTC day, key and model."""
    # SQLite's date() answers text, PostgreSQL's a date: both print as YYYY-MM-DD.
    day = func.date(UsageRollup.hour, type_=String)
    statement = select(
        day,
        UsageRollup.api_key_id,
        UsageRollup.model,
        func.sum(UsageRollup.requests),
        func.sum(UsageRollup.prompt_tokens),
        func.sum(UsageRollup.completion_tokens),
        func.sum(UsageRollup.cost),
    )
    statement = _rolled_up(statement, account_id, usage).group_by(
        day, UsageRollup.api_key_id, UsageRollup.model
    )
    sums = [
        (date.fromisoformat(str(r[0])[:10]), r[1], r[2], int(r[3]), int(r[4]), int(r[5]), r[6])
        for r in db.session.execute(statement)
    ]
    holders = {
        key_id: (name, email)
        for key_id, name, email in db.session.execute(
            select(ApiKey.id, KEY_NAME, Person.email)
            .outerjoin(Membership, Membership.id == ApiKey.member_id)
            .outerjoin(Person, Person.id == Membership.person_id)
            .where(ApiKey.account_id == account_id)
        )
    }
    db.session.commit()
    return RolledUp(sums, holders)


def member_key_ids(member_id: int) -> tuple[int, ...]:
    """Return the ids of every key the member ever had, deleted ones too."""
    ids = tuple(db.session.scalars(select(ApiKey.id).where(ApiKey.member_id == member_id)))
    db.session.commit()
    return ids


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
