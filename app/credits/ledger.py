"""Balance changes: grants, holds and settlement, each one transaction with one commit.

The invariants: an account's ``balance`` equals the sum of its ledger entries; its
``reserved`` equals the sum of its open holds; ``balance - reserved`` never goes below
zero. Every change to a balance is a conditional UPDATE plus a ledger INSERT committed
together, so concurrent requests cannot overspend and no charge is lost or doubled.

Every hold is also reserved on its key's row, and settlement moves the key's
reservation to its month's spend, so that a key's ``month_spent`` and ``month_reserved``
are exact at all times, whether it has a monthly limit or not. A key with a limit is held
to it the same way as an account to its balance: its hold's reservation is conditional
on the month's spend plus what the key's open holds reserve staying within the limit; a
limit put on a key in use counts its running requests' holds from that moment. Statements
take the account's row before the key's, so that two transactions never wait on each
other's rows.

On PostgreSQL a hold, and the settlement of a hold that covers its cost, are each one
statement that applies all of its changes or none, run alone (autocommit): one round
trip, and the rows it locks are free when it ends. SQLite, and every other case, take
the same steps one statement at a time in one transaction (on SQLite it may commit with
the worker's other queued writes, each in a savepoint of its own: SQLiteWriter).
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Insert,
    ScalarSelect,
    Select,
    String,
    Update,
    and_,
    bindparam,
    case,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.sql.elements import BindParameter, ClauseElement
from sqlalchemy.sql.visitors import replacement_traverse

from app.auth.errors import InvalidKey, KeyRevoked
from app.auth.models import ACTIVE, REVOKED, ApiKey
from app.credits.errors import IdempotencyConflict
from app.credits.models import Account, Hold, LedgerEntry
from app.database import (
    COMMIT_AS_CHOSEN,
    COMMIT_WITHOUT_WAITING,
    BoundStatement,
    Money,
    UTCDateTime,
    execute_alone,
    execute_durably,
    execute_on_driver,
    failure_reason,
    runs_alone,
    utcnow,
    write_transaction,
)
from app.extensions import db

log = logging.getLogger(__name__)

GRANT = "grant"
CHARGE = "charge"
OPEN, SETTLED, EXPIRED = "open", "settled", "expired"


# The statements of the hot path are built once: constructing a statement costs more CPU
# than executing it (about 0.15 ms each), and a prebuilt one's cache key is memoized.
_accounts, _holds, _entries = Account.__table__, Hold.__table__, LedgerEntry.__table__
_keys = ApiKey.__table__
_amount = bindparam("amount", type_=Money())
_month = bindparam("month")
# What the key spent in the request's month: a new month starts from zero.
_month_spent = case((_keys.c.spend_month == _month, _keys.c.month_spent), else_=0)

# What a hold needs of the account's row and of its key's, and what it changes there.
# Each is written once: SQLite's step-by-step statements and PostgreSQL's one
# statement are both built from them (when they are called, so that a test can swap one).
_ACCOUNT_ROW = _accounts.c.id == bindparam("account_id")
_ACCOUNT_COVERS = _accounts.c.balance - _accounts.c.reserved >= _amount
_RESERVE_ON_ACCOUNT = {_accounts.c.reserved: _accounts.c.reserved + _amount}
_KEY_ROW = _keys.c.id == bindparam("key_id")
_KEY_WITHIN_LIMIT = or_(
    _keys.c.monthly_limit.is_(None),
    _month_spent + _keys.c.month_reserved + _amount <= _keys.c.monthly_limit,
)
# The key is still as its caller presented it: active, under the same value. A caller
# its process remembers (app.auth.caller_cache) may outlive its key's revocation,
# rotation or deletion for the time the change takes to be heard; nothing is held on it.
_key_digest = bindparam("key_digest", type_=String())
_KEY_AS_PRESENTED = and_(
    _keys.c.state == ACTIVE, or_(_key_digest.is_(None), _keys.c.digest == _key_digest)
)
_RESERVE_ON_KEY = {
    _keys.c.month_spent: _month_spent,
    _keys.c.spend_month: _month,
    _keys.c.month_reserved: _keys.c.month_reserved + _amount,
}


@functools.lru_cache(maxsize=4)
def _reserve_statement(covers: ColumnElement[bool]) -> Update:
    """Return the conditional UPDATE reserving the amount on the account, if it covers it."""
    return update(_accounts).where(_ACCOUNT_ROW, covers).values(_RESERVE_ON_ACCOUNT)


@functools.lru_cache(maxsize=4)
def _reserve_on_key_statement(within_limit: ColumnElement[bool]) -> Update:
    """Return the conditional UPDATE reserving the amount on the key, within its limit.

    It applies only to the key as its caller presented it (_KEY_AS_PRESENTED).
    """
    return update(_keys).where(_KEY_ROW, _KEY_AS_PRESENTED, within_limit).values(_RESERVE_ON_KEY)


_DEBIT = (
    update(_accounts)
    .where(_accounts.c.id == bindparam("account_id"))
    .values(
        balance=_accounts.c.balance - bindparam("charge", type_=Money()),
        reserved=_accounts.c.reserved - bindparam("released", type_=Money()),
    )
)
_SPEND_ON_KEY = (
    update(_keys)
    .where(_keys.c.id == bindparam("key_id"))
    .values(
        month_spent=_month_spent + bindparam("charge", type_=Money()),
        spend_month=_month,
        month_reserved=_keys.c.month_reserved - bindparam("released", type_=Money()),
    )
)
_RELEASE_ON_KEY = (
    update(_keys)
    .where(_keys.c.id == bindparam("key_id"))
    .values(month_reserved=_keys.c.month_reserved - _amount)
)
_INSERT_HOLD = insert(_holds)
_EXTEND_HOLDS = (
    update(_holds)
    .where(_holds.c.id.in_(bindparam("hold_ids", expanding=True)), _holds.c.status == OPEN)
    .values(expires_at=bindparam("expires_at", type_=UTCDateTime()))
)
EXTEND_BATCH = 500
_CLOSE_HOLD = (
    update(_holds)
    .where(_holds.c.id == bindparam("hold_id"), _holds.c.status == OPEN)
    .values(status=bindparam("status"))
)
_INSERT_ENTRY = insert(_entries)


def _with_holder_id(statement: ClauseElement) -> Any:
    """Return ``statement`` with its ``account_id`` parameter renamed ``holder_id``.

    Beside an UPDATE of api_keys, a parameter named account_id would be SET on the
    key's row: SQLAlchemy sets every column named by a parameter of the execution.
    """

    def rename(element: Any) -> Any:
        if isinstance(element, BindParameter) and element.key == "account_id":
            return bindparam("holder_id", type_=element.type)
        return None

    return replacement_traverse(statement, {}, rename)


# Built from the guards and changes the step-by-step statements are built from.
@functools.lru_cache(maxsize=8)
def _hold_in_one_statement(
    covers: ColumnElement[bool], within_limit: ColumnElement[bool] | None
) -> Select:
    """Build PostgreSQL's hold: the account's and key's reservations and the hold's row.

    The guards are checked on the rows locked first (SELECT ... FOR UPDATE, the
    account's before the key's, as in the separate statements), which yields their
    latest versions; the UPDATEs and the INSERT then apply only if both locks matched,
    and check nothing more of rows that nobody else can change meanwhile. So the
    statement applies all of its steps or none, and needs no transaction around it. It
    commits without waiting for the disk (COMMIT_WITHOUT_WAITING), which costs PostgreSQL
    a sync and the request its wait (about 0.25 ms here). A server crash can then lose
    only holds: a settlement is on disk when it returns (execute_durably), and the WAL
    up to it with it, holds included; a settlement whose hold was lost charges what the
    balance allows, as for an expired one. The SELECT says which guards matched. No
    parameter is named like a column of the updated tables: SQLAlchemy would SET it.
    """
    covering = (
        select(_accounts.c.id).where(_with_holder_id(_ACCOUNT_ROW), covers).with_for_update()
    ).cte("covering_account")
    checks = [covering]
    if within_limit is not None:
        within = (
            select(_keys.c.id)
            .where(_KEY_ROW, _KEY_AS_PRESENTED, within_limit, exists(select(covering.c.id)))
            .with_for_update()
        ).cte("key_within_limit")
        checks.append(within)
    gate = exists(select(checks[-1].c.id))
    steps = [
        update(_accounts)
        .where(_with_holder_id(_ACCOUNT_ROW), gate)
        .values(_RESERVE_ON_ACCOUNT)
        .returning(_accounts.c.id)
        .cte("reserved")
    ]
    if within_limit is not None:
        steps.append(
            update(_keys)
            .where(_KEY_ROW, gate)
            .values(_RESERVE_ON_KEY)
            .returning(_keys.c.id)
            .cte("reserved_on_key")
        )
    hold_row = select(
        bindparam("hold_id", type_=String()),
        bindparam("holder_id"),
        _amount,
        bindparam("key_id"),
        bindparam("status", type_=String()),
        bindparam("placed_at", type_=UTCDateTime()),
        bindparam("expires_at", type_=UTCDateTime()),
    ).where(gate)
    steps.append(
        insert(_holds)
        .from_select(
            ["id", "account_id", "amount", "api_key_id", "status", "created_at", "expires_at"],
            hold_row,
        )
        .returning(_holds.c.id)
        .cte("inserted_hold")
    )
    return select(*(_row_count(check) for check in checks), COMMIT_WITHOUT_WAITING).add_cte(*steps)


def _row_count(cte: CTE) -> ScalarSelect:
    return select(func.count()).select_from(cte).scalar_subquery()


RecordShapes = tuple[tuple[Insert, tuple[str, ...]], ...]


@functools.lru_cache(maxsize=16)
def _settlement_in_one_statement(
    close_hold: Update,
    debit: Update,
    spend_on_key: Update | None,
    with_entry: bool,
    records: RecordShapes,
) -> Select:
    """Build PostgreSQL's settlement of a hold that covers its cost, with its records.

    _CLOSE_HOLD, then _DEBIT, _SPEND_ON_KEY, _INSERT_ENTRY and the records' INSERTs
    (the generation's row), each only if the hold was still open (rows
    taken in the same order as the separate statements); the SELECT says whether it was,
    and commits as execute_durably chooses (COMMIT_AS_CHOSEN). A hold that was not has
    applied nothing, and is settled step by step. Nothing else can make a step miss its
    row, so the statement needs no transaction around it. No parameter is named like a
    column of the updated tables: SQLAlchemy would SET it.
    """
    closed = close_hold.returning(_holds.c.id).cte("closed_hold")
    gate = exists(select(closed.c.id))
    debited = _with_holder_id(debit).where(gate).returning(_accounts.c.id).cte("debited")
    steps = [closed, debited]
    if spend_on_key is not None:
        spent = (
            spend_on_key.where(exists(select(debited.c.id)))
            .returning(_keys.c.id)
            .cte("spent_on_key")
        )
        steps.append(spent)
    if with_entry:
        entry_row = select(
            bindparam("holder_id"),
            bindparam("kind", type_=String()),
            bindparam("entry_amount", type_=Money()),
            bindparam("generation_id", type_=String()),
            bindparam("charged_at", type_=UTCDateTime()),
        ).where(gate)
        entry = (
            insert(_entries)
            .from_select(["account_id", "kind", "amount", "generation_id", "created_at"], entry_row)
            .returning(_entries.c.id)
            .cte("charge_entry")
        )
        steps.append(entry)
    for index, (statement, names) in enumerate(records):
        steps.append(_record_step(statement, names, f"record{index}_", gate))
    return select(_row_count(closed), COMMIT_AS_CHOSEN).add_cte(*steps)


def _record_step(statement: Insert, names: tuple[str, ...], prefix: str, gate: Any) -> CTE:
    """Return a record's INSERT as a step applied only through ``gate``.

    Its parameters take ``prefix``, so that they cannot meet the settlement's own.
    """
    row = select(
        *(bindparam(prefix + name, type_=statement.table.c[name].type) for name in names)
    ).where(gate)
    return (
        statement.from_select(list(names), row)
        .returning(literal_column("1"))
        .cte(prefix.rstrip("_"))
    )


@dataclass(frozen=True)
class HeldCredit:
    """An open hold: credit set aside for one request (and on ``key_id``'s allowance)."""

    id: str
    account_id: int
    amount: Decimal
    key_id: int | None = None


@dataclass(frozen=True)
class Shortfall:
    """Why a hold could not be placed: what was asked and what was available."""

    requested: Decimal
    available: Decimal


@dataclass(frozen=True)
class MonthlyLimitShortfall:
    """Why a hold could not be placed: the key's monthly limit, not the balance."""

    requested: Decimal
    available: Decimal
    monthly_limit: Decimal


def spend_month(moment: datetime) -> int:
    """Return the calendar month (UTC) that ``moment`` falls in, as ``YYYYMM``."""
    return moment.year * 100 + moment.month


def month_start(moment: datetime) -> datetime:
    """Return the first instant of the calendar month (UTC) that ``moment`` falls in."""
    return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def grant_credits(
    *,
    account_id: int,
    amount: Decimal,
    idempotency_key: str | None = None,
    description: str | None = None,
    granted_by: str | None = None,
) -> tuple[LedgerEntry, bool]:
    """Add ``amount`` USD to the balance; return the entry and whether it is new.

    A grant repeated with the same idempotency key is applied once: the first entry is
    returned. ``granted_by`` (an operator's email) is recorded in the description as
    ``granted by EMAIL: description``. :raise IdempotencyConflict: the key was used for
    a different amount.
    """
    if amount <= 0:
        raise ValueError("a grant must be a positive amount")
    if granted_by:
        description = f"granted by {granted_by}" + (f": {description}" if description else "")
        description = description[:255]
    if idempotency_key and (entry := _grant_by_key(account_id, idempotency_key)):
        return _same_grant_or_raise(entry, amount), False
    entry = LedgerEntry(
        account_id=account_id,
        kind=GRANT,
        amount=amount,
        idempotency_key=idempotency_key,
        description=description,
    )
    db.session.add(entry)
    db.session.execute(
        update(Account).where(Account.id == account_id).values(balance=Account.balance + amount)
    )
    try:
        db.session.commit()
    except IntegrityError:
        # A concurrent grant with the same key won the race: return its entry.
        db.session.rollback()
        if idempotency_key and (entry := _grant_by_key(account_id, idempotency_key)):
            return _same_grant_or_raise(entry, amount), False
        raise
    return entry, True


def _grant_by_key(account_id: int, idempotency_key: str) -> LedgerEntry | None:
    return db.session.scalar(
        select(LedgerEntry).where(
            LedgerEntry.account_id == account_id,
            LedgerEntry.idempotency_key == idempotency_key,
        )
    )


def _same_grant_or_raise(entry: LedgerEntry, amount: Decimal) -> LedgerEntry:
    if entry.kind != GRANT or entry.amount != amount:
        raise IdempotencyConflict(
            f"idempotency key {entry.idempotency_key!r} was used for a grant of {entry.amount}"
        )
    return entry


_BALANCE_SHORT, _KEY_REFUSED = "balance", "key"


def place_hold(
    *,
    account_id: int,
    amount: Decimal,
    ttl_seconds: int,
    key_id: int | None = None,
    key_digest: str | None = None,
    hold_id: str | None = None,
) -> HeldCredit | Shortfall | MonthlyLimitShortfall:
    """Set ``amount`` aside for a request, or return why it cannot be covered.

    ``hold_id`` names the hold: a generation's hold takes the generation's id, so that
    whatever finds the hold (the sweeper, a retried Idempotency-Key) knows whose it is.

    With ``key_id`` the amount is also reserved on the key's row, in the same
    transaction, within the key's monthly limit if it has one, and only while the key is
    active (and still has ``key_digest``, the digest its caller presented, if given).
    Holds left behind by dead workers are released first when they stand in the way.

    :raise KeyRevoked: the key was revoked since its caller was found.
    :raise InvalidKey: the key was deleted or rotated since its caller was found.
    """
    key = (key_id, key_digest)
    hold_id = hold_id or secrets.token_hex(16)
    held = _try_place_hold(hold_id, account_id, amount, ttl_seconds, key)
    if not isinstance(held, HeldCredit) and release_expired_holds(account_id=account_id):
        held = _try_place_hold(hold_id, account_id, amount, ttl_seconds, key)
    if held == _BALANCE_SHORT:
        return Shortfall(requested=amount, available=available_balance(account_id))
    if held == _KEY_REFUSED:
        return _key_shortfall(key_id, key_digest, amount)
    return held


def _try_place_hold(
    hold_id: str,
    account_id: int,
    amount: Decimal,
    ttl_seconds: int,
    key: tuple[int | None, str | None],
) -> HeldCredit | str:
    now = utcnow()
    key_id, key_digest = key
    hold = {
        "id": hold_id,
        "account_id": account_id,
        "amount": amount,
        "api_key_id": key_id,
        "status": OPEN,
        "created_at": now,
        "expires_at": now + timedelta(seconds=ttl_seconds),
    }
    if runs_alone():
        outcome = _place_hold_in_one_statement(hold, spend_month(now), key_digest)
    else:
        outcome = _place_hold_step_by_step(hold, spend_month(now), key_digest)
    if outcome is not None:
        return outcome
    return HeldCredit(id=hold["id"], account_id=account_id, amount=amount, key_id=key_id)


class _HoldRefused(Exception):
    """Raised by a hold's step that did not apply, so that its transaction is rolled back."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


def _place_hold_step_by_step(hold: dict, month: int, key_digest: str | None) -> str | None:
    """Reserve on the account, then on the key, then record the hold; None if all applied.

    One transaction: committed if every step applied, else rolled back.
    """
    try:
        write_transaction(lambda connection: _apply_hold_steps(connection, hold, month, key_digest))
    except _HoldRefused as refused:
        return refused.outcome
    return None


def _apply_hold_steps(
    connection: Connection, hold: dict, month: int, key_digest: str | None
) -> None:
    reserved = execute_on_driver(
        connection,
        _reserve_statement(_ACCOUNT_COVERS),
        {"account_id": hold["account_id"], "amount": hold["amount"]},
    )
    if reserved != 1:
        raise _HoldRefused(_BALANCE_SHORT)
    if hold["api_key_id"] is not None:
        on_key = execute_on_driver(
            connection,
            _reserve_on_key_statement(_KEY_WITHIN_LIMIT),
            {
                "key_id": hold["api_key_id"],
                "key_digest": key_digest,
                "amount": hold["amount"],
                "month": month,
            },
        )
        if on_key != 1:
            raise _HoldRefused(_KEY_REFUSED)
    execute_on_driver(connection, _INSERT_HOLD, hold)


def _place_hold_in_one_statement(hold: dict, month: int, key_digest: str | None) -> str | None:
    """Do what _place_hold_step_by_step does in one statement, alone (PostgreSQL)."""
    statement, parameters = hold_statement(hold, month, key_digest)
    matched = execute_alone(statement, parameters, prepared=True)[0]
    if matched[0] != 1:
        return _BALANCE_SHORT
    if hold["api_key_id"] is not None and matched[1] != 1:
        return _KEY_REFUSED
    return None


def hold_statement(
    hold: dict, month: int, key_digest: str | None = None
) -> tuple[Select, dict[str, Any]]:
    """Return PostgreSQL's statement placing ``hold`` (a holds row's values), and its parameters."""
    parameters = {
        "hold_id": hold["id"],
        "holder_id": hold["account_id"],
        "amount": hold["amount"],
        "key_id": hold["api_key_id"],
        "key_digest": key_digest,
        "status": hold["status"],
        "placed_at": hold["created_at"],
        "expires_at": hold["expires_at"],
        "month": month,
    }
    with_key = hold["api_key_id"] is not None
    statement = _hold_in_one_statement(_ACCOUNT_COVERS, _KEY_WITHIN_LIMIT if with_key else None)
    return statement, parameters


def _key_shortfall(key_id: int, key_digest: str | None, amount: Decimal) -> MonthlyLimitShortfall:
    """Return what the key's monthly limit leaves, once sure the key itself may be used.

    :raise KeyRevoked, InvalidKey: as place_hold.
    """
    key = db.session.execute(
        select(
            _keys.c.state,
            _keys.c.digest,
            _keys.c.monthly_limit,
            _month_spent.label("spent"),
            _keys.c.month_reserved,
        ).where(_keys.c.id == key_id),
        {"month": spend_month(utcnow())},
    ).first()
    db.session.commit()
    if key is not None and key.state == REVOKED:
        raise KeyRevoked()
    if key is None or key.state != ACTIVE or key_digest not in (None, key.digest):
        # The key's row was removed, or the key deleted or rotated, after its caller was found.
        raise InvalidKey()
    limit = key.monthly_limit or Decimal(0)
    available = max(limit - key.spent - key.month_reserved, Decimal(0))
    return MonthlyLimitShortfall(requested=amount, available=available, monthly_limit=limit)


def available_balance(account_id: int) -> Decimal:
    """Return the balance minus open holds."""
    row = db.session.execute(
        select(Account.balance, Account.reserved).where(Account.id == account_id)
    ).one()
    db.session.commit()
    return row.balance - row.reserved


Records = Callable[[Decimal], Sequence[BoundStatement]]


def settle_hold(
    hold: HeldCredit,
    *,
    cost: Decimal,
    generation_id: str,
    records: Records = lambda charge: (),
    fallback_records: Records | None = None,
) -> Decimal:
    """Replace ``hold`` by a charge of ``cost``; return the charge.

    ``records(charge)`` gives the statements (with their parameters) that must be
    committed with the charge or not at all: the generation record, the key's last use.
    If they cannot be written (a row they name is gone), the charge is committed with
    ``fallback_records(charge)`` instead, so that it is never lost with them.
    A cost above the hold (or a hold that expired meanwhile) is charged as far as the
    balance and the key's monthly limit allow, never below zero or past the limit; what
    is left unpaid is logged, and is the generation record's shortfall. A hold placed on
    a key moves from the key's reservation to its month's spend.

    A settlement is never given up for a database that does not answer: it is tried
    again, on another connection, until it commits (or the process ends, and the sweeper
    settles the hold when it expires). A try that failed may have committed all the
    same (the connection was lost during the COMMIT): each try after the first asks the
    hold first, and a hold found settled is not charged again.
    """
    charge = _settle_until_committed(hold, cost, generation_id, (records, fallback_records))
    if charge < cost:
        log.warning(
            "generation %s priced at $%s but only $%s could be charged: $%s unpaid",
            generation_id,
            cost,
            charge,
            cost - charge,
        )
    return charge


# Errors that say nothing was (or may not have been) committed, and another try can mend:
# a lost connection, a server going away or restarting, a lock not granted in time.
RETRYABLE_ERRORS = (OperationalError, InterfaceError)
# Seconds between a settlement's tries: doubling from the first to the last.
SETTLE_RETRY_PAUSES = (0.05, 5.0)


def _settle_until_committed(
    hold: HeldCredit,
    cost: Decimal,
    generation_id: str,
    records: tuple[Records, Records | None],
) -> Decimal:
    pause, longest = SETTLE_RETRY_PAUSES
    tries = 0
    while True:
        try:
            if tries and (charged := settled_charge(hold.id, generation_id)) is not None:
                return charged
            return _settle_with_records(hold, cost, generation_id, records)
        except RETRYABLE_ERRORS as error:
            tries += 1
            log.warning(
                "generation %s: its settlement failed (%s, try %d); trying again in %.2f s",
                generation_id,
                failure_reason(error),
                tries,
                pause,
            )
        time.sleep(pause)
        pause = min(pause * 2, longest)


def settled_charge(hold_id: str, generation_id: str) -> Decimal | None:
    """Return what the settlement of ``hold_id`` charged, or None if it is not settled."""
    status = db.session.scalar(select(Hold.status).where(Hold.id == hold_id))
    charged = db.session.scalar(
        select(LedgerEntry.amount).where(LedgerEntry.generation_id == generation_id)
    )
    db.session.commit()
    if status != SETTLED:
        return None
    return -charged if charged is not None else Decimal(0)


def _settle_with_records(
    hold: HeldCredit,
    cost: Decimal,
    generation_id: str,
    records: tuple[Records, Records | None],
) -> Decimal:
    """Settle with the records, or with the fallback records if those cannot be written."""
    first, fallback = records
    try:
        return _settle_once(hold, cost, generation_id, first)
    except IntegrityError:
        if fallback is None:
            raise
        log.warning(
            "generation %s: its records could not be written; settled with fallback records",
            generation_id,
        )
        return _settle_once(hold, cost, generation_id, fallback)


def _settle_once(hold: HeldCredit, cost: Decimal, generation_id: str, records: Records) -> Decimal:
    if cost <= hold.amount and runs_alone():
        statements = records(cost)
        if all(isinstance(statement, Insert) for statement, _ in statements) and (
            _settle_covered_in_one_statement(hold, cost, generation_id, statements)
        ):
            return cost

    def settle(connection: Connection) -> Decimal:
        charge = _settle_step_by_step(connection, hold, cost, generation_id)
        for statement, parameters in records(charge):
            execute_on_driver(connection, statement, parameters)
        return charge

    return write_transaction(settle)


def _settle_covered_in_one_statement(
    hold: HeldCredit, cost: Decimal, generation_id: str, inserts: Sequence[BoundStatement]
) -> bool:
    """Charge ``cost`` (at most the hold) with its records if the hold is still open.

    Return whether it was; if not, nothing was applied. One statement, alone
    (PostgreSQL): its INSERTs are written with the charge or not at all. A record that
    updates a row (the key's last use, once a minute) is not one of them: the key's row
    is already updated by the charge, and a statement may update a row only once.
    """
    on_key = _SPEND_ON_KEY if hold.key_id is not None else None
    shapes = tuple((statement, tuple(parameters)) for statement, parameters in inserts)
    statement = _settlement_in_one_statement(_CLOSE_HOLD, _DEBIT, on_key, cost > 0, shapes)
    now = utcnow()
    parameters = {
        "hold_id": hold.id,
        "status": SETTLED,
        "holder_id": hold.account_id,
        "charge": cost,
        "released": hold.amount,
        "key_id": hold.key_id,
        "month": spend_month(now),
        "kind": CHARGE,
        "entry_amount": -cost,
        "generation_id": generation_id,
        "charged_at": now,
    }
    for index, (_, record) in enumerate(inserts):
        parameters.update({f"record{index}_{name}": value for name, value in record.items()})
    closed = execute_durably(statement, parameters)[0][0]
    return closed == 1


def _settle_step_by_step(
    connection: Connection, hold: HeldCredit, cost: Decimal, generation_id: str
) -> Decimal:
    """Close the hold, charge the balance and the key's month, record the charge; return it."""
    released = execute_on_driver(connection, _CLOSE_HOLD, {"hold_id": hold.id, "status": SETTLED})
    # An expired hold was released by the sweeper: nothing of it is reserved any more.
    reserved_change = hold.amount if released == 1 else Decimal(0)
    charge = cost if cost <= reserved_change else _payable(connection, hold, cost, reserved_change)
    execute_on_driver(
        connection,
        _DEBIT,
        {"account_id": hold.account_id, "charge": charge, "released": reserved_change},
    )
    if hold.key_id is not None:
        execute_on_driver(
            connection,
            _SPEND_ON_KEY,
            {
                "key_id": hold.key_id,
                "charge": charge,
                "released": reserved_change,
                "month": spend_month(utcnow()),
            },
        )
    if charge > 0:
        execute_on_driver(
            connection,
            _INSERT_ENTRY,
            {
                "account_id": hold.account_id,
                "kind": CHARGE,
                "amount": -charge,
                "generation_id": generation_id,
                "idempotency_key": None,
                "description": None,
                "created_at": utcnow(),
            },
        )
    return charge


def _payable(connection: Connection, hold: HeldCredit, cost: Decimal, reserved: Decimal) -> Decimal:
    """Return how much of ``cost`` can be charged beyond what is still ``reserved``.

    The rows are locked, account first, so that the room read is the room charged.
    """
    room = max(_locked_available_balance(connection, hold.account_id), Decimal(0))
    if (
        hold.key_id is not None
        and (allowance := _locked_key_allowance(connection, hold.key_id)) is not None
    ):
        room = min(room, allowance)
    return min(cost, reserved + room)


def _locked_available_balance(connection: Connection, account_id: int) -> Decimal:
    row = connection.execute(
        select(Account.balance, Account.reserved).where(Account.id == account_id).with_for_update()
    ).one()
    return row.balance - row.reserved


def _locked_key_allowance(connection: Connection, key_id: int) -> Decimal | None:
    """Return what a key may still spend this month beyond its reservations (None: no limit)."""
    row = connection.execute(
        select(_keys.c.monthly_limit, _month_spent.label("spent"), _keys.c.month_reserved)
        .where(_keys.c.id == key_id)
        .with_for_update(),
        {"month": spend_month(utcnow())},
    ).first()
    if row is None or row.monthly_limit is None:
        return None
    return max(row.monthly_limit - row.spent - row.month_reserved, Decimal(0))


def extend_hold(hold: HeldCredit, *, ttl_seconds: int) -> None:
    """Push an open hold's expiry forward, for a request that is still alive."""
    extend_holds([hold.id], ttl_seconds=ttl_seconds)


def extend_holds(hold_ids: Sequence[str], *, ttl_seconds: int) -> int:
    """Push the expiry of the open holds among ``hold_ids`` forward; return how many."""
    expires_at = utcnow() + timedelta(seconds=ttl_seconds)

    def extend(connection: Connection) -> int:
        extended = 0
        for start in range(0, len(hold_ids), EXTEND_BATCH):
            batch = list(hold_ids[start : start + EXTEND_BATCH])
            parameters = {"hold_ids": batch, "expires_at": expires_at}
            extended += connection.execute(_EXTEND_HOLDS, parameters).rowcount
        return extended

    return write_transaction(extend)


_RECORD_PROGRESS = (
    update(_holds)
    .where(_holds.c.id == bindparam("hold_id"), _holds.c.status == OPEN)
    .values(progress=bindparam("progress"))
)


def record_progress(progress_by_hold: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Keep each open hold's ``progress``: what its stream delivered, priced if it dies.

    One statement for all of them, in one transaction.
    """
    if not progress_by_hold:
        return
    rows = [{"hold_id": hold_id, "progress": progress} for hold_id, progress in progress_by_hold]
    write_transaction(lambda connection: connection.execute(_RECORD_PROGRESS, rows))


def expired_holds_with_progress(*, limit: int = 500) -> list[tuple[HeldCredit, dict[str, Any]]]:
    """Return open holds past their expiry whose stream recorded progress, with it.

    Their worker died while they streamed: they are settled at their progress
    (``app.generations.lifecycle.settle_interrupted``), not released.
    """
    rows = db.session.execute(
        select(Hold.id, Hold.account_id, Hold.amount, Hold.api_key_id, Hold.progress)
        .where(Hold.status == OPEN, Hold.expires_at < utcnow(), Hold.progress.is_not(None))
        .limit(limit)
    ).all()
    db.session.commit()
    return [
        (HeldCredit(row.id, row.account_id, row.amount, row.api_key_id), row.progress)
        for row in rows
    ]


def release_expired_holds(*, account_id: int | None = None, limit: int = 500) -> int:
    """Release open holds past their expiry (their worker died); return how many.

    A hold whose stream recorded progress is left to be settled at it (see
    ``expired_holds_with_progress``).
    """
    query = select(Hold.id, Hold.account_id, Hold.amount, Hold.api_key_id).where(
        Hold.status == OPEN, Hold.expires_at < utcnow(), Hold.progress.is_(None)
    )
    if account_id is not None:
        query = query.where(Hold.account_id == account_id)
    expired = db.session.execute(query.limit(limit)).all()
    db.session.commit()
    released = 0
    for row in expired:
        released += _expire_hold(row.id, row.account_id, row.amount, row.api_key_id)
    return released


def _expire_hold(hold_id: str, account_id: int, amount: Decimal, key_id: int | None) -> int:
    def expire(connection: Connection) -> int:
        closed = execute_on_driver(connection, _CLOSE_HOLD, {"hold_id": hold_id, "status": EXPIRED})
        if closed != 1:
            return 0
        execute_on_driver(
            connection, _DEBIT, {"account_id": account_id, "charge": 0, "released": amount}
        )
        if key_id is not None:
            execute_on_driver(connection, _RELEASE_ON_KEY, {"key_id": key_id, "amount": amount})
        return 1

    return write_transaction(expire)


@dataclass(frozen=True)
class CreditSummary:
    """An account's money at a glance, in USD."""

    granted: Decimal
    used: Decimal
    balance: Decimal


def credit_summary(account_id: int) -> CreditSummary:
    """Return what was granted to and charged from the account, and its balance."""
    rows = db.session.execute(
        select(LedgerEntry.kind, func.sum(LedgerEntry.amount))
        .where(LedgerEntry.account_id == account_id)
        .group_by(LedgerEntry.kind)
    ).all()
    balance = db.session.scalar(select(Account.balance).where(Account.id == account_id))
    db.session.commit()
    sums = {kind: total for kind, total in rows}
    return CreditSummary(
        granted=sums.get(GRANT, Decimal(0)),
        used=-sums.get(CHARGE, Decimal(0)),
        balance=balance,
    )
