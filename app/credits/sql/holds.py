"""The statements that place a hold: reserve on the account, the key and the member, write its row.

SQLite runs the guarded UPDATEs one at a time in a transaction (``reserve_on_account``,
``reserve_on_key``, ``reserve_on_member``, then ``INSERT_HOLD``); PostgreSQL runs the
same guards and changes as one statement built from them (``hold_in_one_statement``),
alone. A hold whose key and member have no budget reserves on the account alone, and
each database has a statement for it that sets up nothing of the rows' reservations
(``hold_without_reservations``, ``INSERT_HOLD_RESERVING_NOTHING``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Insert,
    Integer,
    ScalarSelect,
    Select,
    String,
    TableClause,
    Update,
    bindparam,
    exists,
    false,
    insert,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import BindParameter, ClauseElement
from sqlalchemy.sql.visitors import replacement_traverse

from app.credits.models import OPEN
from app.credits.sql import guards
from app.credits.sql.guards import (
    ACCOUNT_ROW,
    KEY_AS_PRESENTED,
    KEY_ROW,
    KEYS_MEMBER,
    RESERVE_ON_ACCOUNT,
    RESERVE_ON_KEY,
    RESERVE_ON_MEMBER,
    accounts,
    amount,
    constant,
    holds,
    keys,
    memberships,
    reserves_on,
    row_count,
    spent_in_window,
    window_start_now,
)
from app.database import COMMIT_WITHOUT_WAITING, UTCDateTime

# What a hold reads of its key, as presented, and of its member, before it reserves on
# either: whether each is reserved on (reserves_on), and the window each would count
# the hold in. A row that is not reserved on is read, never locked nor written.
KEY_AND_MEMBER_TO_HOLD = (
    select(
        keys.c.id,
        keys.c.member_id,
        reserves_on(keys).label("key_reserves"),
        window_start_now(keys).label("key_window"),
        reserves_on(memberships).label("member_reserves"),
        window_start_now(memberships).label("member_window"),
    )
    .join_from(keys, memberships, memberships.c.id == keys.c.member_id)
    .where(KEY_ROW, KEY_AS_PRESENTED)
)


@functools.lru_cache(maxsize=4)
def reserve_on_account(covers: ColumnElement[bool]) -> Update:
    """Return the conditional UPDATE reserving the amount on the account, if it covers it."""
    return update(accounts).where(ACCOUNT_ROW, covers).values(RESERVE_ON_ACCOUNT)


@functools.lru_cache(maxsize=4)
def reserve_on_key(within_limit: ColumnElement[bool]) -> Update:
    """Return the conditional UPDATE reserving the amount on the key, within its budget.

    It applies only to the key as its caller presented it (KEY_AS_PRESENTED), and
    returns the start of the window it counts the hold in.
    """
    return (
        update(keys)
        .where(KEY_ROW, KEY_AS_PRESENTED, within_limit)
        .values(RESERVE_ON_KEY)
        .returning(keys.c.window_start)
    )


@functools.lru_cache(maxsize=4)
def reserve_on_member(within: ColumnElement[bool]) -> Update:
    """Return the conditional UPDATE reserving the amount on the key's member, within budget.

    It returns the start of the window it counts the hold in.
    """
    return (
        update(memberships)
        .where(KEYS_MEMBER, within)
        .values(RESERVE_ON_MEMBER)
        .returning(memberships.c.window_start)
    )


INSERT_HOLD = insert(holds)


def with_holder_id(statement: ClauseElement) -> Any:
    """Return ``statement`` with its ``account_id`` parameter renamed ``holder_id``.

    Beside an UPDATE of api_keys, a parameter named account_id would be SET on the
    key's row.
    """

    def rename(element: Any) -> Any:
        if isinstance(element, BindParameter) and element.key == "account_id":
            return bindparam("holder_id", type_=element.type)
        return None

    return replacement_traverse(statement, {}, rename)


@functools.lru_cache(maxsize=8)
def hold_in_one_statement(
    covers: ColumnElement[bool],
    within_limit: ColumnElement[bool] | None,
    member_within: ColumnElement[bool] | None = None,
) -> Select:
    """Build PostgreSQL's hold: the account's, key's and member's reservations, the hold's row.

    The guards are checked on the rows locked first (SELECT ... FOR NO KEY UPDATE, the
    account's, then the key's, then its member's, as in the separate statements), which
    yields their latest versions; the UPDATEs and the INSERT then apply only if every
    lock matched, and check nothing more of rows that nobody else can change meanwhile.
    So the statement applies all of its steps or none, and needs no transaction around
    it. Each row is read once, as it is locked: the windows it counts the hold in and
    the spend they start from are worked out there, and its UPDATE and the hold's row
    take them from the lock (_KeyAndMemberLocked). The key's and member's rows are
    locked whether or not they are reserved on (a key whose holds reserve on neither
    takes hold_without_reservations); only those reserved on are written. The locks
    are the weakest an UPDATE takes (NO KEY), so that a foreign key's check of the same
    row by another request's settlement does not wait for them. It commits without
    waiting for the disk (COMMIT_WITHOUT_WAITING), which costs
    PostgreSQL a sync and the request its wait (about 0.25 ms here). A server crash can
    then lose only holds: a settlement is on disk when it returns (execute_durably), and
    the WAL up to it with it, holds included; a settlement whose hold was lost charges
    what the balance allows, as for an expired one. The SELECT says which guards
    matched. The hold's row notes the windows its key and member counted it in, and
    whether it reserved on each.
    """
    covering = (
        select(accounts.c.id)
        .where(with_holder_id(ACCOUNT_ROW), covers)
        .with_for_update(key_share=True)
    ).cte("covering_account")
    holder_id = bindparam("holder_id", type_=Integer())
    if within_limit is None:
        passed = [covering]
        reserved = update(accounts).where(
            with_holder_id(ACCOUNT_ROW), exists(select(covering.c.id))
        )
        steps = [reserved.values(RESERVE_ON_ACCOUNT).cte("reserved")]
        notes: list[Any] = [null(), null(), false(), false()]
        source = covering
    else:
        member_within = member_within if member_within is not None else guards.MEMBER_WITHIN_BUDGET
        locked = _KeyAndMemberLocked.of(covering, within_limit, member_within)
        passed = [covering, locked.key, locked.member]
        # Each row through the step before: nothing is written unless every lock matched.
        holder = select(holder_id).select_from(locked.member).scalar_subquery()
        reserved = update(accounts).where(accounts.c.id == holder)
        steps = [reserved.values(RESERVE_ON_ACCOUNT).cte("reserved")]
        steps += locked.reservations()
        notes = locked.notes()
        source = locked.member
    steps.append(_insert_hold(notes, source))
    counted = [row_count(check) for check in passed]
    if within_limit is not None:
        counted.append(locked.reserving())
    return select(*counted, COMMIT_WITHOUT_WAITING).add_cte(*steps)


@functools.lru_cache(maxsize=4)
def hold_without_reservations(covers: ColumnElement[bool]) -> Select:
    """Build PostgreSQL's hold with a key whose row and member's row are not reserved on.

    hold_in_one_statement for a key and member without budgets, without the locks and
    UPDATEs it would not run: PostgreSQL sets up every part of a statement it
    executes, run or not, and those of the rows' reservations were a third of the
    hold's work. The key is read as presented, and its member, neither locked nor
    written; the account's reservation is the one guarded change, as conditional as
    on SQLite, and the hold's row is written only with it. The SELECT says whether the
    hold was placed, and whether the key and member let it be: if not (the key is not
    as presented, or a row is reserved on), hold_in_one_statement says why, or holds.
    """
    # One read: the key as presented, and neither its row nor its member's reserved on.
    passed = (
        select(
            bindparam("holder_id", type_=Integer()).label("holder_id"),
            window_start_now(keys).label("key_window"),
            window_start_now(memberships).label("member_window"),
        )
        .join_from(keys, memberships, memberships.c.id == keys.c.member_id)
        .where(KEY_ROW, KEY_AS_PRESENTED, ~reserves_on(keys), ~reserves_on(memberships))
    ).cte("nothing_to_reserve")
    # The account's row through the read that passed, which its RETURNING passes on.
    reserved = (
        update(accounts)
        .where(accounts.c.id == passed.c.holder_id, covers)
        .values(RESERVE_ON_ACCOUNT)
        .returning(passed.c.key_window, passed.c.member_window)
        .cte("reserved")
    )
    notes = [reserved.c.key_window, reserved.c.member_window, false(), false()]
    placed = _insert_hold(notes, reserved)
    counted = [row_count(reserved), row_count(passed)]
    return select(*counted, COMMIT_WITHOUT_WAITING).add_cte(placed)


def _scalar(column: Any) -> ScalarSelect:
    return select(column).scalar_subquery()


@dataclass(frozen=True)
class _KeyAndMemberLocked:
    """The CTEs that lock a hold's key and its member, each held to its guard.

    Each returns, of its row as locked: whether the hold reserves on it (reserves_on),
    the start of the window it counts the hold in, and what the row spent in that
    window, with which the row's UPDATE starts a new window (reserve_in_window).
    """

    key: CTE
    member: CTE

    @classmethod
    def of(
        cls, covering: CTE, within_limit: ColumnElement[bool], member_within: ColumnElement[bool]
    ) -> _KeyAndMemberLocked:
        """Lock the key as presented, within ``within_limit``, then its member, ``member_within``.

        The key is taken only once the account covered the hold, the member only once the
        key passed (its lock waits for the key's check).
        """
        key = (
            select(
                keys.c.id,
                keys.c.member_id,
                *_window_of_hold(keys, "key"),
            )
            .where(KEY_ROW, KEY_AS_PRESENTED, within_limit, exists(select(covering.c.id)))
            .with_for_update(key_share=True)
        ).cte("key_locked")
        member = (
            select(memberships.c.id, *_window_of_hold(memberships, "member"))
            .where(memberships.c.id == _scalar(key.c.member_id), member_within)
            .with_for_update(key_share=True)
        ).cte("member_locked")
        return cls(key, member)

    def reservations(self) -> list[CTE]:
        """Return the UPDATEs of the key's and the member's rows, of those reserved on alone."""
        steps = []
        for rows, locked, name in ((keys, self.key, "key"), (memberships, self.member, "member")):
            reserved_here = select(locked.c.id).where(locked.c[f"{name}_reserves"])
            if locked is self.key:
                # Through the member's lock: nothing is written unless it matched too.
                reserved_here = reserved_here.where(exists(select(self.member.c.id)))
            changes = {
                rows.c.window_spent: _scalar(locked.c[f"{name}_spent"]),
                rows.c.window_start: _scalar(locked.c[f"{name}_window"]),
                rows.c.window_reserved: rows.c.window_reserved + amount,
            }
            reserving = update(rows).where(rows.c.id == reserved_here.scalar_subquery())
            steps.append(reserving.values(changes).cte(f"reserved_on_{name}"))
        return steps

    def reserving(self) -> ColumnElement[bool]:
        """Return whether the hold reserves on its key or its member (None: not placed)."""
        return or_(_scalar(self.key.c.key_reserves), _scalar(self.member.c.member_reserves))

    def notes(self) -> list[Any]:
        """Return what the hold's row notes: its key's and member's windows, what it reserved on."""
        return [
            _scalar(self.key.c.key_window),
            self.member.c.member_window,
            _scalar(self.key.c.key_reserves),
            self.member.c.member_reserves,
        ]


def _window_of_hold(rows: TableClause, name: str) -> list[Any]:
    """Return what a hold reads of ``rows``' row as it locks it, labelled ``name``_...."""
    return [
        reserves_on(rows).label(f"{name}_reserves"),
        window_start_now(rows).label(f"{name}_window"),
        spent_in_window(rows).label(f"{name}_spent"),
    ]


def _insert_hold(notes: list[Any], source: CTE) -> CTE:
    """Return the INSERT of the hold's row, written from ``source``'s row: none, if it has none.

    A scan of the step before sets up less than a condition on it.
    """
    hold_row = select(*_hold_values(), *notes).select_from(source)
    return insert(holds).from_select(_HOLD_COLUMNS, hold_row).cte("inserted_hold")


# A hold's row: its own values, then what it notes of its key's and member's rows.
_HOLD_COLUMNS = ["id", "account_id", "amount", "api_key_id", "status", "created_at", "expires_at"]
_HOLD_COLUMNS += ["key_window_start", "member_window_start"]
_HOLD_COLUMNS += ["reserved_on_key", "reserved_on_member"]


def _hold_values() -> list[Any]:
    """Return a hold's own values, as parameters, in _HOLD_COLUMNS' order."""
    return [
        bindparam("hold_id", type_=String()),
        bindparam("holder_id"),
        amount,
        bindparam("key_id"),
        constant(OPEN),
        bindparam("placed_at", type_=UTCDateTime()),
        bindparam("expires_at", type_=UTCDateTime()),
    ]


def _insert_hold_reading_rows() -> Insert:
    """Return the INSERT of a hold's row from its key's and member's rows, read."""
    windows = [window_start_now(keys), window_start_now(memberships)]
    row = (
        select(*_hold_values(), *windows, false(), false())
        .join_from(keys, memberships, memberships.c.id == keys.c.member_id)
        .where(KEY_ROW, KEY_AS_PRESENTED, ~reserves_on(keys), ~reserves_on(memberships))
    )
    return insert(holds).from_select(_HOLD_COLUMNS, row)


# The hold's row, written only if its key is as presented and neither its row nor its
# member's is reserved on: the windows read noted, nothing reserved. SQLite's hold with
# a key without budgets, in one statement after the account's reservation.
INSERT_HOLD_RESERVING_NOTHING = _insert_hold_reading_rows()
