"""The ledger's statements, built once: each guard and each change of a row written once.

Constructing a statement costs more CPU than executing it (about 0.15 ms each), and a
prebuilt one's cache key is memoized. SQLite runs the guarded UPDATEs one at a time in
a transaction; PostgreSQL runs the same guards and changes as one statement built from
them (``hold_in_one_statement``, ``settlement_in_one_statement``), alone. A hold whose
key and member have no budget reserves on the account alone, and each database has a
statement for it that sets up nothing of the rows' reservations
(``hold_without_reservations``, ``INSERT_HOLD_RESERVING_NOTHING``). The builders take
the guards as arguments, looked up when they are called, so that a test can swap one
for a broken one and watch the invariants catch it. Constants are written into the
statements' text (``constant``); every value sent is a parameter bound once.

No parameter is named like a column of the table a statement updates: SQLAlchemy
would SET every column named by a parameter of the execution.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
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
    TableClause,
    Update,
    and_,
    bindparam,
    case,
    column,
    exists,
    false,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    table,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import BindParameter, ClauseElement
from sqlalchemy.sql.visitors import replacement_traverse

from app.auth.models import ACTIVE, ApiKey
from app.budgets import DAY, ROLLING_MICROS, WEEK
from app.credits.chain import sql_digest
from app.credits.models import (
    CHARGE,
    NO_KEY,
    OPEN,
    SETTLED,
    Account,
    Hold,
    LedgerEntry,
    UsageRollup,
)
from app.database import (
    COMMIT_AS_CHOSEN,
    COMMIT_WITHOUT_WAITING,
    Money,
    UTCDateTime,
    later_of,
    utc_hour,
)
from app.money import MAX_MONEY, money_units

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
# The open status is a parameter, not a constant: PostgreSQL could then prove the
# sweeper's partial index of open holds usable, and a generic plan may scan every open
# hold for the one closed, where the primary key finds it at once.
CLOSE_HOLD = (
    update(holds)
    .where(holds.c.id == bindparam("hold_id"), holds.c.status == bindparam("open", OPEN))
    .values(status=bindparam("status"))
)
SETTLE_HOLD = CLOSE_HOLD.values(status=constant(SETTLED))
DEBIT_AND_RELEASE = {
    accounts.c.balance: accounts.c.balance - charge,
    accounts.c.reserved: accounts.c.reserved - released,
}
DEBIT = update(accounts).where(ACCOUNT_ROW).values(DEBIT_AND_RELEASE)


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
HOLD_ROW = holds.c.id == bindparam("hold_id")


def noted(column: ColumnElement[Any]) -> ScalarSelect:
    """Return what the hold's row (``hold_id``) notes in ``column``."""
    return select(column).where(HOLD_ROW).scalar_subquery()


SPEND_ON_KEY = spend_on_key(noted(holds.c.key_window_start), noted(holds.c.reserved_on_key))
SPEND_ON_MEMBER = spend_on_member(
    noted(holds.c.member_window_start), noted(holds.c.reserved_on_member)
)
HOLD_RESERVATIONS = select(holds.c.reserved_on_key, holds.c.reserved_on_member).where(HOLD_ROW)
# An expired hold gives back its reservations, from the rows it reserved on alone.
RELEASE_ON_KEY = (
    update(keys)
    .where(KEY_ROW, noted(holds.c.reserved_on_key))
    .values(window_reserved=keys.c.window_reserved - amount)
)
RELEASE_ON_MEMBER = (
    update(memberships)
    .where(KEYS_MEMBER, noted(holds.c.reserved_on_member))
    .values(window_reserved=memberships.c.window_reserved - amount)
)


# The ledger's chain (app.credits.chain): an entry is written with the digest of its
# fields and of the account's head, and the UPDATE that changes the balance moves the
# head to it. What the entry is: a charge is ``charge`` (its amount is -charge), a grant
# a negative charge; ``released`` is what the change gives back of the reservation.
@dataclass(frozen=True)
class EntryValues:
    """The expressions an entry's kind, generation, reference, note and time are written from."""

    kind: Any
    generation_id: Any
    reference: Any
    note: Any
    at: Any
    micros: Any


# A step's entry: every value a parameter.
STEP_ENTRY = EntryValues(
    kind=bindparam("entry_kind", type_=String()),
    generation_id=bindparam("entry_generation", type_=String()),
    reference=bindparam("entry_reference", type_=String()),
    note=bindparam("entry_note", type_=String()),
    at=bindparam("entry_at", type_=UTCDateTime()),
    micros=bindparam("entry_micros", type_=BigInteger()),
)
# A grant's guard: the balance stays within what the ledger holds. On SQLite an integer
# sum past 64 bits turns to a float: it is refused before it is written.
WITHIN_MAX_BALANCE = accounts.c.balance <= constant(money_units(MAX_MONEY)) + charge
_CHAINED_COLUMNS = [
    "id",
    "account_id",
    "kind",
    "amount",
    "balance_after",
    "generation_id",
    "idempotency_key",
    "description",
    "created_at",
    "previous_hash",
    "entry_hash",
]
# SQLite's next id of an entry, under its write lock: what it would choose itself.
_NEXT_ENTRY_ID = select(func.coalesce(func.max(entries.c.id), ZERO) + constant(1)).scalar_subquery()


def _digest(entry_id: Any, account: Any, balance: Any, head: Any, values: EntryValues) -> Any:
    """Return the digest of the entry ``values`` describe, written after ``head``."""
    return sql_digest(
        entry_id,
        account,
        values.kind,
        -charge,
        balance - charge,
        values.generation_id,
        values.reference,
        values.micros,
        head,
    )


@functools.lru_cache(maxsize=4)
def insert_chained_entry(guard: ColumnElement[bool] | None = None) -> Insert:
    """Return SQLite's INSERT of a step's entry, chained after the account's head.

    Written from the account's row (none if ``guard`` fails it), before the balance
    changes: DEBIT_TO_NEW_HEAD then moves the balance and the head to it.
    """
    row = select(
        _NEXT_ENTRY_ID,
        accounts.c.id,
        STEP_ENTRY.kind,
        -charge,
        accounts.c.balance - charge,
        STEP_ENTRY.generation_id,
        STEP_ENTRY.reference,
        STEP_ENTRY.note,
        STEP_ENTRY.at,
        accounts.c.ledger_head,
        _digest(
            _NEXT_ENTRY_ID, accounts.c.id, accounts.c.balance, accounts.c.ledger_head, STEP_ENTRY
        ),
    ).where(ACCOUNT_ROW, *([guard] if guard is not None else []))
    return insert(entries).from_select(_CHAINED_COLUMNS, row)


DEBIT_TO_NEW_HEAD = (
    update(accounts)
    .where(ACCOUNT_ROW)
    .values(
        {
            **DEBIT_AND_RELEASE,
            accounts.c.ledger_head: select(entries.c.entry_hash)
            .where(entries.c.id == func.last_insert_rowid())
            .scalar_subquery(),
        }
    )
)


@dataclass(frozen=True)
class ChainedDebit:
    """PostgreSQL's debit with its entry, as steps of one statement.

    The account's row is locked first, and the entry's id drawn only then: an account's
    entries are chained in the order of their ids however many write at once.
    """

    steps: tuple[CTE, ...]
    entry: Insert

    @classmethod
    def of(cls, account_row: Any, guard: Any, values: EntryValues) -> ChainedDebit:
        """Chain an entry of ``values`` to the account of ``account_row``, if ``guard`` passes."""
        locked = (
            select(accounts.c.id, accounts.c.ledger_head)
            .where(account_row, *([guard] if guard is not None else []))
            .with_for_update(key_share=True)
        ).cte("chain_locked")
        numbered = select(
            locked.c.id,
            locked.c.ledger_head,
            func.nextval(literal_column("'ledger_entries_id_seq'")).label("entry_id"),
        ).cte("chain_numbered")
        digest = _digest(
            numbered.c.entry_id, accounts.c.id, accounts.c.balance, numbered.c.ledger_head, values
        )
        debited = (
            update(accounts)
            .where(accounts.c.id == numbered.c.id)
            .values({**DEBIT_AND_RELEASE, accounts.c.ledger_head: digest})
            .returning(
                accounts.c.id,
                accounts.c.balance,
                accounts.c.ledger_head,
                numbered.c.entry_id,
                numbered.c.ledger_head.label("previous_hash"),
            )
            .cte("debited")
        )
        row = select(
            debited.c.entry_id,
            debited.c.id,
            values.kind,
            -charge,
            debited.c.balance,
            values.generation_id,
            values.reference,
            values.note,
            values.at,
            debited.c.previous_hash,
            debited.c.ledger_head,
        )
        return cls((locked, numbered, debited), insert(entries).from_select(_CHAINED_COLUMNS, row))


@functools.lru_cache(maxsize=4)
def chained_debit_alone(guard: ColumnElement[bool] | None = None) -> Insert:
    """Return PostgreSQL's debit of a step with its chained entry, one statement (ChainedDebit)."""
    chained = ChainedDebit.of(ACCOUNT_ROW, guard, STEP_ENTRY)
    return chained.entry.add_cte(*chained.steps)


EXTEND_HOLDS = (
    update(holds)
    .where(holds.c.id.in_(bindparam("hold_ids", expanding=True)), holds.c.status == OPEN)
    .values(expires_at=bindparam("expires_at", type_=UTCDateTime()))
)
RECORD_PROGRESS = (
    update(holds)
    .where(holds.c.id == bindparam("hold_id"), holds.c.status == OPEN)
    .values(progress=bindparam("progress"))
)
# The same, run alone (execute_alone): its RETURNING gives the driver rows to read.
RECORD_PROGRESS_ALONE = RECORD_PROGRESS.returning(holds.c.id)

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

# What an account and a key have, to say why a hold was refused or how much more than
# its hold a settlement may charge; the locked ones take the rows, account first.
ACCOUNT_MONEY = select(accounts.c.balance, accounts.c.reserved).where(ACCOUNT_ROW)
KEY_MONEY = select(
    keys.c.budget,
    spent_in_window(keys).label("spent"),
    keys.c.window_reserved,
    keys.c.budget_window,
    keys.c.state,
    keys.c.digest,
).where(KEY_ROW)
MEMBER_MONEY = select(
    memberships.c.budget,
    spent_in_window(memberships).label("spent"),
    memberships.c.window_reserved,
    memberships.c.budget_window,
).where(KEYS_MEMBER)
LOCKED_ACCOUNT_MONEY = ACCOUNT_MONEY.with_for_update()
LOCKED_KEY_MONEY = KEY_MONEY.with_for_update()
LOCKED_MEMBER_MONEY = MEMBER_MONEY.with_for_update()


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
        member_within = member_within if member_within is not None else MEMBER_WITHIN_BUDGET
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
    counted = [_row_count(check) for check in passed]
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
    counted = [_row_count(reserved), _row_count(passed)]
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


def _row_count(cte: CTE) -> ScalarSelect:
    return select(func.count()).select_from(cte).scalar_subquery()


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
    return select(_row_count(closed), COMMIT_AS_CHOSEN).add_cte(*steps)


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
