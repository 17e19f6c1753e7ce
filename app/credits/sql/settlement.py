"""The statements that settle a hold: close it, charge the account, spend on the key and member.

SQLite runs them one at a time in a transaction (``SETTLE_HOLD`` by way of
``CLOSE_HOLD``, ``DEBIT`` or a chained entry, ``SPEND_ON_KEY``, ``SPEND_ON_MEMBER``,
``ROLL_UP``); PostgreSQL runs the settlement of a hold that covers its cost, with the
generation's record and the hour's rollup, as one statement built from the same
changes (``settlement_in_one_statement``).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Insert,
    Integer,
    ScalarSelect,
    Select,
    String,
    Update,
    bindparam,
    func,
    null,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql

from app.credits.models import CHARGE, NO_KEY, SETTLED
from app.credits.sql.entries import ChainedDebit, EntryValues
from app.credits.sql.guards import (
    CLOSE_HOLD,
    DEBIT_AND_RELEASE,
    HOLD_ROW,
    KEY_ROW,
    KEYS_MEMBER,
    accounts,
    constant,
    holds,
    keys,
    memberships,
    noted,
    rollups,
    row_count,
    spend_in_window,
)
from app.database import COMMIT_AS_CHOSEN, UTCDateTime, utc_hour

SETTLE_HOLD = CLOSE_HOLD.values(status=constant(SETTLED))


def spend_on_key(
    held_in: ColumnElement[Any], reserved_here: ColumnElement[bool], row: Any = KEY_ROW
) -> Update:
    """Return a settlement's UPDATE of the key: reservation to the spend of ``held_in``.

    It records the key's use too: the one write of the key's row a request makes when
    the key has no budget (its hold only read the row).
    """
    return (
        update(keys)
        .where(row)
        .values({**spend_in_window(keys, held_in, reserved_here), keys.c.last_used_at: used_at})
    )


def spend_on_member(
    held_in: ColumnElement[Any], reserved_here: ColumnElement[bool], row: Any = KEYS_MEMBER
) -> Update:
    """Return a settlement's UPDATE of the key's member: reservation to the spend of ``held_in``."""
    changes = spend_in_window(memberships, held_in, reserved_here)
    return update(memberships).where(row).values(changes)


# A settlement moves the key's and its member's reservations to the spend of the windows
# the hold noted, as its row says when it is closed: a budget whose window changed since
# notes its holds anew, and a budget set since takes over its reservation
# (app.accounts.budgets).
used_at = bindparam("used_at", type_=UTCDateTime())


SPEND_ON_KEY = spend_on_key(noted(holds.c.key_window_start), noted(holds.c.reserved_on_key))
SPEND_ON_MEMBER = spend_on_member(
    noted(holds.c.member_window_start), noted(holds.c.reserved_on_member)
)
HOLD_RESERVATIONS = select(holds.c.reserved_on_key, holds.c.reserved_on_member).where(HOLD_ROW)


# A charge totalled into its account's, key's, model's and UTC hour's row: the same
# INSERT ... ON CONFLICT DO UPDATE on SQLite and PostgreSQL. Its parameters are named
# rollup_<column>, apart from every other statement's of a settlement.
ROLLUP_KEY = ("account_id", "api_key_id", "model", "hour")
ROLLUP_SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost",
    "shortfall",
)
ROLLUP_PREFIX = "rollup_"
ROLL_UP = text(
    f"INSERT INTO usage_rollups ({', '.join(ROLLUP_KEY + ROLLUP_SUMS)}) "
    f"VALUES ({', '.join(':' + ROLLUP_PREFIX + name for name in ROLLUP_KEY + ROLLUP_SUMS)}) "
    f"ON CONFLICT ({', '.join(ROLLUP_KEY)}) DO UPDATE SET "
    + ", ".join(f"{name} = usage_rollups.{name} + excluded.{name}" for name in ROLLUP_SUMS)
).bindparams(
    *(
        bindparam(ROLLUP_PREFIX + name, type_=rollups.c[name].type)
        for name in ROLLUP_KEY + ROLLUP_SUMS
    )
)


# A settlement's charge: the negative of what was charged, at the time the key was used.
_CHARGE_ENTRY = EntryValues(
    kind=constant(CHARGE),
    generation_id=bindparam("generation_id", type_=String()),
    reference=null(),
    note=null(),
    at=used_at,
    micros=bindparam("used_micros", type_=BigInteger()),
)


# An INSERT written with a settlement, and the names of the columns it sets.
RecordShape = tuple[Insert, tuple[str, ...]]


@functools.lru_cache(maxsize=16)
def settlement_in_one_statement(
    with_key: bool, with_entry: bool, record: RecordShape | None, with_rollup: bool
) -> Select:
    """Build PostgreSQL's settlement of a hold that covers its cost, with its record.

    CLOSE_HOLD, then DEBIT, SPEND_ON_KEY, SPEND_ON_MEMBER, INSERT_ENTRY, the record's INSERT (the
    generation's row) and ROLL_UP, each only if the hold was still open (rows taken in
    the same order as the separate statements); the SELECT says whether it was, and
    commits as execute_durably chooses (COMMIT_AS_CHOSEN). A hold that was not has applied nothing,
    and is settled step by step. Nothing else can make a step miss its row, so the
    statement needs no transaction around it.
    """
    closed = SETTLE_HOLD.returning(
        holds.c.id,
        holds.c.account_id,
        holds.c.key_window_start,
        holds.c.member_window_start,
        holds.c.reserved_on_key,
        holds.c.reserved_on_member,
    ).cte("closed_hold")

    def closed_notes(column: Any) -> ScalarSelect:
        return select(column).scalar_subquery()

    # Each row is found through the step before, which takes the rows in order and
    # applies none of them if the hold was not open (its row id is then NULL).
    holder = accounts.c.id == closed_notes(closed.c.account_id)
    if with_entry:
        chained = ChainedDebit.of(holder, None, _CHARGE_ENTRY)
        debited = chained.steps[-1]
        steps = [closed, *chained.steps]
    else:
        debited = (
            update(accounts)
            .where(holder)
            .values(DEBIT_AND_RELEASE)
            .returning(accounts.c.id)
            .cte("debited")
        )
        steps = [closed, debited]
    if with_key:
        # The windows and reservations as the closed row says, after any lock it waited for.
        key_id = bindparam("key_id", type_=Integer())
        key_after_debit = select(key_id).select_from(debited).scalar_subquery()
        spent = (
            spend_on_key(
                closed_notes(closed.c.key_window_start),
                closed_notes(closed.c.reserved_on_key),
                keys.c.id == key_after_debit,
            )
            .returning(keys.c.member_id)
            .cte("spent_on_key")
        )
        steps.append(spent)
        on_member = spend_on_member(
            closed_notes(closed.c.member_window_start),
            closed_notes(closed.c.reserved_on_member),
            memberships.c.id == closed_notes(spent.c.member_id),
        )
        steps.append(on_member.cte("spent_on_member"))
    if with_entry:
        steps.append(chained.entry.cte("charge_entry"))
    if record is not None:
        steps.append(_record_step(*record, closed))
    if with_rollup:
        steps.append(_rollup_step(closed, record[0].table if record is not None else None))
    return select(row_count(closed), COMMIT_AS_CHOSEN).add_cte(*steps)


def _rollup_step(closed: CTE, record_table: Any) -> CTE:
    """Return ROLL_UP as a step of PostgreSQL's one statement, written from ``closed``'s row.

    ``closed`` is the hold's row as the settlement closed it: none, and nothing is
    written, if the hold was not open (as for every INSERT of the settlement: a scan of
    the closed row sets up less than a condition on it).

    With a record (into ``record_table``, the generation's row), the record's values
    are the rollup's too (a keyless record's under NO_KEY): they are sent once, as the
    record's.
    """
    names = ROLLUP_KEY + ROLLUP_SUMS
    values = _rolled_up_record(record_table) if record_table is not None else None
    row = select(
        *(
            values[name] if values else bindparam(ROLLUP_PREFIX + name, type_=rollups.c[name].type)
            for name in names
        )
    ).select_from(closed)
    upsert = postgresql.insert(rollups).from_select(list(names), row)
    upsert = upsert.on_conflict_do_update(
        index_elements=list(ROLLUP_KEY),
        set_={name: rollups.c[name] + upsert.excluded[name] for name in ROLLUP_SUMS},
    )
    return upsert.cte("rolled_up")


def _rolled_up_record(record_table: Any) -> dict[str, Any]:
    """Return the rollup's values as the record's parameters (the generation's row) say."""

    def recorded(name: str) -> Any:
        return bindparam(RECORD_PREFIX + name, type_=record_table.c[name].type)

    values = {name: recorded(name) for name in ROLLUP_SUMS if name != "requests"}
    values.update(
        account_id=recorded("account_id"),
        api_key_id=func.coalesce(recorded("api_key_id"), constant(NO_KEY)),
        model=recorded("model"),
        hour=utc_hour(recorded("created_at")),
        requests=constant(1),
    )
    return values


# The prefix of the record's parameters in the settlement's statement, so that they
# cannot meet the settlement's own.
RECORD_PREFIX = "record_"


def _record_step(statement: Insert, names: tuple[str, ...], closed: CTE) -> CTE:
    """Return a record's INSERT as a step written from ``closed``'s row (_rollup_step)."""
    row = select(
        *(bindparam(RECORD_PREFIX + name, type_=statement.table.c[name].type) for name in names)
    ).select_from(closed)
    return statement.from_select(list(names), row).cte("record")
