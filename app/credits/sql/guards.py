"""The tables the ledger writes, and each guard and change of their rows, written once.

Every statement of the ledger (holds, settlement, entries, expiry, balances, beside this
module) is built from these: the account's, key's and member's rows, the guards a hold
must pass on each (``ACCOUNT_COVERS``, ``KEY_WITHIN_LIMIT``, ``MEMBER_WITHIN_BUDGET``),
the budget windows a row counts its spend in, and the changes that reserve, debit and
close. The money API looks the guards up here when it calls a builder, so that a test
can swap one for a broken one and watch the invariants catch it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Integer,
    ScalarSelect,
    String,
    TableClause,
    and_,
    bindparam,
    case,
    column,
    func,
    literal_column,
    or_,
    select,
    table,
    update,
)

from app.auth.models import ACTIVE, ApiKey
from app.budgets import DAY, ROLLING_MICROS, WEEK
from app.credits.models import OPEN, Account, Hold, LedgerEntry, UsageRollup
from app.database import Money, later_of

accounts, holds, entries = Account.__table__, Hold.__table__, LedgerEntry.__table__
rollups = UsageRollup.__table__
keys = ApiKey.__table__
# The member's budget counters (app.accounts.models.Membership, a layer above, which
# builds on the ledger): the columns the ledger reads and writes, named here.
memberships = table(
    "memberships",
    column("id", Integer()),
    column("budget", Money()),
    column("budget_window", String()),
    column("window_start", BigInteger()),
    column("window_spent", Money()),
    column("window_reserved", Money()),
)
amount = bindparam("amount", type_=Money())
charge = bindparam("charge", type_=Money())
released = bindparam("released", type_=Money())


def constant(value: str | int) -> ColumnElement[Any]:
    """Return ``value`` written into a statement's text: a constant, not a parameter.

    A parameter is sent and bound on every execution, and on PostgreSQL each one is
    parsed and evaluated from the EXECUTE's text; a window's name or a length never
    changes. Only for the module's own constants, never for a value from outside.
    """
    if isinstance(value, str):
        return literal_column(f"'{value}'", String())
    return literal_column(str(int(value)), BigInteger())


ZERO = constant(0)


def calendar_window_start(rows: TableClause) -> ColumnElement[int]:
    """Return the start of ``rows``' calendar window at the statement's time.

    The calendar windows' starts are parameters (app.budgets.window_parameters). A
    window never goes back: a statement whose time was read just before a boundary
    that another has crossed since counts in the window the row is in.
    """
    start = case(
        (rows.c.budget_window == constant(DAY), bindparam("day_start", type_=BigInteger())),
        (rows.c.budget_window == constant(WEEK), bindparam("week_start", type_=BigInteger())),
        else_=bindparam("month_start", type_=BigInteger()),
    )
    return later_of(rows.c.window_start, start)


def rolling(rows: TableClause) -> ColumnElement[bool]:
    """Return whether ``rows``' row counts its spend in a rolling window (``5h``)."""
    return or_(*(rows.c.budget_window == constant(window) for window in ROLLING_MICROS))


def window_start_now(rows: TableClause) -> ColumnElement[int]:
    """Return the start of the window the hold's time falls in, for ``rows``' row.

    A rolling window goes on while it lasts, and starts again at the hold's time after.
    """
    now = bindparam("now_micros", type_=BigInteger())
    started = [
        (
            rows.c.budget_window == constant(window),
            case((rows.c.window_start > now - constant(micros), rows.c.window_start), else_=now),
        )
        for window, micros in ROLLING_MICROS.items()
    ]
    return case(*started, else_=calendar_window_start(rows))


def window_start_settled(rows: TableClause) -> ColumnElement[int]:
    """Return the start of the window a settlement leaves ``rows``' row in.

    A calendar window that began since the row's rolls over, so that a row no hold
    writes (it has no budget) still counts its window's true spend; a rolling window
    is started by a request's hold alone, never by a settlement.
    """
    return case((rolling(rows), rows.c.window_start), else_=calendar_window_start(rows))


def spent_in_window(rows: TableClause) -> ColumnElement[Any]:
    """Return what ``rows``' row spent in the hold's window: a new window starts at zero."""
    return case((rows.c.window_start == window_start_now(rows), rows.c.window_spent), else_=ZERO)


def reserves_on(rows: TableClause) -> ColumnElement[bool]:
    """Return whether a hold reserves on ``rows``' row: it has a budget, or a rolling window.

    A reservation on a row without a budget protects nothing, and is not written; a
    rolling window's row is, since its holds start its window.
    """
    return or_(rows.c.budget.is_not(None), rolling(rows))


def within_budget(rows: TableClause) -> ColumnElement[bool]:
    """Return the guard of a hold on ``rows``' row: no budget, or room for the amount."""
    return or_(
        rows.c.budget.is_(None),
        spent_in_window(rows) + rows.c.window_reserved + amount <= rows.c.budget,
    )


def reserve_in_window(rows: TableClause) -> dict[Any, Any]:
    """Return a hold's change to ``rows``' row: its window rolled over, the amount reserved."""
    return {
        rows.c.window_spent: spent_in_window(rows),
        rows.c.window_start: window_start_now(rows),
        rows.c.window_reserved: rows.c.window_reserved + amount,
    }


def spend_in_window(
    rows: TableClause, held_in: ColumnElement[Any], reserved_here: ColumnElement[bool]
) -> dict[Any, Any]:
    """Return a settlement's change to ``rows``' row: its reservation released, its charge spent.

    The charge counts in the window the hold was placed in (``held_in``), if that is
    the row's window once rolled over (window_start_settled): in a window that has
    ended since, it counts no more. The reservation released is the hold's if it
    reserved on the row (``reserved_here``), nothing otherwise.
    """
    start = window_start_settled(rows)
    return {
        rows.c.window_start: start,
        rows.c.window_spent: case((rows.c.window_start == start, rows.c.window_spent), else_=ZERO)
        + case((start == held_in, charge), else_=ZERO),
        rows.c.window_reserved: rows.c.window_reserved
        - case((reserved_here, released), else_=ZERO),
    }


# What a hold needs of the account's row, its key's and its member's, and what it changes there.
ACCOUNT_ROW = accounts.c.id == bindparam("account_id")
ACCOUNT_COVERS = accounts.c.balance - accounts.c.reserved >= amount
RESERVE_ON_ACCOUNT = {accounts.c.reserved: accounts.c.reserved + amount}
KEY_ROW = keys.c.id == bindparam("key_id")
KEY_WITHIN_LIMIT = within_budget(keys)
# The key is still as its caller presented it: active, under the same value. A caller
# its process remembers (app.auth.caller_cache) may outlive its key's revocation,
# rotation or deletion for the time the change takes to be heard; nothing is held on it.
key_digest = bindparam("key_digest", type_=String())
KEY_AS_PRESENTED = and_(
    keys.c.state == constant(ACTIVE), or_(key_digest.is_(None), keys.c.digest == key_digest)
)
RESERVE_ON_KEY = reserve_in_window(keys)
# The key's member: a key belongs to one member for its life.
KEYS_MEMBER = memberships.c.id == select(keys.c.member_id).where(KEY_ROW).scalar_subquery()
MEMBER_WITHIN_BUDGET = within_budget(memberships)
RESERVE_ON_MEMBER = reserve_in_window(memberships)


# The open status is a parameter, not a constant: PostgreSQL could then prove the
# sweeper's partial index of open holds usable, and a generic plan may scan every open
# hold for the one closed, where the primary key finds it at once.
CLOSE_HOLD = (
    update(holds)
    .where(holds.c.id == bindparam("hold_id"), holds.c.status == bindparam("open", OPEN))
    .values(status=bindparam("status"))
)


DEBIT_AND_RELEASE = {
    accounts.c.balance: accounts.c.balance - charge,
    accounts.c.reserved: accounts.c.reserved - released,
}
DEBIT = update(accounts).where(ACCOUNT_ROW).values(DEBIT_AND_RELEASE)


HOLD_ROW = holds.c.id == bindparam("hold_id")


def noted(column: ColumnElement[Any]) -> ScalarSelect:
    """Return what the hold's row (``hold_id``) notes in ``column``."""
    return select(column).where(HOLD_ROW).scalar_subquery()


def row_count(cte: CTE) -> ScalarSelect:
    """Return how many rows the step ``cte`` gave (none: its guard did not pass)."""
    return select(func.count()).select_from(cte).scalar_subquery()
