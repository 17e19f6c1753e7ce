"""The money API: grant credits, hold a request's worst case, settle it once, end dead holds.

The invariants: an account's ``balance`` equals the sum of its ledger entries; its
``reserved`` equals the sum of its open holds; ``balance - reserved`` never goes below
zero. Every change to a balance is a conditional UPDATE plus a ledger INSERT committed
together, so concurrent requests cannot overspend and no charge is lost or doubled.

A key or member with a budget is held to it the same way as an account to its balance: a
hold is also reserved on its row, conditional on the window's spend plus what its open
holds reserve staying within the budget, and settlement moves that reservation to the
spend of the budget window the hold was placed in (app.budgets). A key or member without
a budget is never written by a hold (the key as its caller presented it): a reservation
there would protect nothing, and writing the row on every hold doubled its writes; on
PostgreSQL a hold that reserves on one of the two rows locks both (one read each,
hold_sql.hold_in_one_statement). The settlement counts every charge in the row's
window all the same, so that ``window_spent`` is exact whether the row has a budget or
not, and a budget set later starts from the window's true spend. Each hold notes whether
it reserved on its key and on its member, and whatever ends it (settlement, expiry)
releases exactly that, so that ``window_reserved`` is the sum of the open holds that
reserved on the row; a budget put on a row in use takes over its running requests' holds
from that moment (app.accounts.budgets says how budgets set or removed meanwhile are
counted). Rows are taken account first, then key, then member, so that two transactions
never wait on each other's.

Each write is offered to the database in two shapes built from the same guards
(``app.credits.sql``): its steps, run in one transaction, and, where it can be,
one statement that applies all of them or none, which a database whose statements run
alone (PostgreSQL) runs instead: one round trip, its rows locked only while it runs.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, func, literal_column, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from app.auth.errors import InvalidKey, KeyRevoked
from app.auth.models import ACTIVE, REVOKED
from app.budgets import MONTH, calendar_start, window_parameters
from app.credits.chain import epoch_micros
from app.credits.errors import AlreadyRecorded, GrantOutOfRange, HoldVoided, IdempotencyConflict
from app.credits.models import (
    CHARGE,
    EXPIRED,
    GRANT,
    NO_KEY,
    OPEN,
    SETTLED,
    TAKE_BACK,
    VOIDED,
    Account,
    Hold,
    LedgerEntry,
)
from app.credits.sql import balances as balance_sql
from app.credits.sql import entries as entry_sql
from app.credits.sql import expiry as expiry_sql
from app.credits.sql import guards
from app.credits.sql import holds as hold_sql
from app.credits.sql import settlement as settlement_sql
from app.database import (
    BoundStatement,
    execute_alone,
    execute_durably,
    execute_on_driver,
    failure_reason,
    fetch_on_driver,
    utcnow,
    write_transaction,
)
from app.extensions import db
from app.money import MAX_MONEY, MONEY_QUANTUM, exact_money

log = logging.getLogger(__name__)

# How many holds one renewal statement names.
EXTEND_BATCH = 500
# Errors that say nothing was (or may not have been) committed, and another try can mend:
# a lost connection, a server going away or restarting, a lock not granted in time.
RETRYABLE_ERRORS = (OperationalError, InterfaceError)
# Seconds between a settlement's tries: doubling from the first to the last.
SETTLE_RETRY_PAUSES = (0.05, 5.0)


@dataclass(frozen=True)
class HeldCredit:
    """An open hold: credit set aside for one request (and on ``key_id``'s allowance)."""

    id: str
    account_id: int
    amount: Decimal
    key_id: int | None = None


@dataclass(frozen=True)
class Rollup:
    """Where a charge is totalled: its model and UTC hour, and the tokens it paid for.

    The account and the key are the hold's; the ledger adds the request, what was
    charged and what was left unpaid (usage_rollups, one row an hour).
    """

    model: str
    hour: datetime
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0


def hour_of(moment: datetime) -> datetime:
    """Return the start of the UTC hour ``moment`` falls in, as rollups file it."""
    return moment.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class Shortfall:
    """Why a hold could not be placed: what was asked and what was available.

    ``balance`` below zero: the account is in debt (a payment was taken back after its
    credit was spent), which refuses every request until it is paid back.
    """

    requested: Decimal
    available: Decimal
    balance: Decimal = Decimal(0)

    @property
    def in_debt(self) -> bool:
        """Whether the balance is below zero."""
        return self.balance < 0


# Whose budget stopped a hold.
KEY_BUDGET, MEMBER_BUDGET = "key", "member"


@dataclass(frozen=True)
class BudgetShortfall:
    """Why a hold could not be placed: the key's or its member's budget, not the balance."""

    requested: Decimal
    available: Decimal
    budget: Decimal
    window: str
    # KEY_BUDGET or MEMBER_BUDGET.
    holder: str


def month_start(moment: datetime) -> datetime:
    """Return the first instant of the calendar month (UTC) that ``moment`` falls in."""
    return calendar_start(MONTH, moment)


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
    _refuse_out_of_range(amount)
    if granted_by:
        description = f"granted by {granted_by}" + (f": {description}" if description else "")
        description = description[:255]
    if idempotency_key and (entry := _grant_by_key(account_id, idempotency_key)):
        return _same_grant_or_raise(entry, amount), False
    try:
        try:
            _append_grant(db.session.connection(), account_id, amount, idempotency_key, description)
        except GrantOutOfRange:
            db.session.rollback()
            raise
        # The account's row is locked (or SQLite's write lock held): its last entry is this one.
        entry = db.session.scalar(
            select(LedgerEntry)
            .where(LedgerEntry.account_id == account_id)
            .order_by(LedgerEntry.id.desc())
            .limit(1)
        )
        db.session.commit()
    except IntegrityError:
        # A concurrent grant with the same key won the race: return its entry.
        db.session.rollback()
        if idempotency_key and (entry := _grant_by_key(account_id, idempotency_key)):
            return _same_grant_or_raise(entry, amount), False
        raise
    return entry, True


def _refuse_out_of_range(amount: Decimal) -> None:
    if amount <= 0 or amount > MAX_MONEY or not exact_money(amount):
        raise GrantOutOfRange(
            f"a grant must be a positive amount of whole {MONEY_QUANTUM} USD, "
            f"at most {MAX_MONEY}: {amount}"
        )


def grant_within(
    connection: Connection,
    *,
    account_id: int,
    amount: Decimal,
    idempotency_key: str,
    description: str,
) -> None:
    """Add ``amount`` USD to the balance, in the caller's transaction on ``connection``.

    For credit that comes with a change of state of its own (an order paid, a code
    redeemed), which must commit with it or not at all. ``idempotency_key`` names what
    the credit came from: the ledger's unique key refuses a second grant of it
    (IntegrityError), whatever the caller's own guard missed.
    """
    _refuse_out_of_range(amount)
    _append_grant(connection, account_id, amount, idempotency_key, description)


def _append_grant(
    connection: Connection,
    account_id: int,
    amount: Decimal,
    reference: str | None,
    note: str | None,
) -> None:
    """Chain a grant's entry and raise the balance, unless it would pass MAX_MONEY."""
    chained = _append_entry(
        connection,
        account_id=account_id,
        kind=GRANT,
        amount=amount,
        reference=reference,
        note=note,
        guard=entry_sql.WITHIN_MAX_BALANCE,
    )
    if not chained:
        raise GrantOutOfRange(f"the balance would pass the most the ledger holds: {MAX_MONEY} USD")


def take_back_within(
    connection: Connection,
    *,
    account_id: int,
    amount: Decimal,
    idempotency_key: str,
    description: str,
) -> None:
    """Take ``amount`` USD of a payment's credit back (a refund, a dispute), in one transaction.

    The caller's, on ``connection``, with the change of state that takes it back.
    Never lowered to what is left: credit already spent is not taken from past charges,
    and the balance may go below zero, which refuses every new hold until it is paid back.
    """
    _refuse_out_of_range(amount)
    _append_entry(
        connection,
        account_id=account_id,
        kind=TAKE_BACK,
        amount=-amount,
        reference=idempotency_key,
        note=description,
    )


def _append_entry(
    connection: Connection,
    *,
    account_id: int,
    kind: str,
    amount: Decimal,
    generation_id: str | None = None,
    reference: str | None = None,
    note: str | None = None,
    released: Decimal = Decimal(0),
    guard: Any = None,
) -> bool:
    """Add ``amount`` to the balance with its entry, chained; return False if ``guard`` refused.

    ``released`` is given back of the account's reservation in the same UPDATE. On
    PostgreSQL one statement; on SQLite the entry, then the UPDATE that moves the
    balance and the head to it (entry_sql.insert_chained_entry).
    """
    now = utcnow()
    parameters = {
        "account_id": account_id,
        "charge": -amount,
        "released": released,
        "entry_kind": kind,
        "entry_generation": generation_id,
        "entry_reference": reference,
        "entry_note": note[:255] if note else note,
        "entry_at": now,
        "entry_micros": epoch_micros(now),
    }
    if connection.dialect.name == "postgresql":
        return execute_on_driver(connection, entry_sql.chained_debit_alone(guard), parameters) == 1
    if execute_on_driver(connection, entry_sql.insert_chained_entry(guard), parameters) != 1:
        return False
    execute_on_driver(connection, entry_sql.DEBIT_TO_NEW_HEAD, parameters)
    return True


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


# How a hold's try ended.
_HELD, _BALANCE_SHORT, _KEY_REFUSED, _MEMBER_REFUSED = "held", "balance", "key", "member"


def place_hold(
    *,
    account_id: int,
    amount: Decimal,
    ttl_seconds: int,
    key_id: int | None = None,
    key_digest: str | None = None,
    hold_id: str | None = None,
) -> HeldCredit | Shortfall | BudgetShortfall:
    """Set ``amount`` aside for a request, or return why it cannot be covered.

    ``hold_id`` names the hold: a generation's hold takes the generation's id, so that
    whatever finds the hold (the sweeper, a retried Idempotency-Key) knows whose it is.
    With ``key_id`` the hold is placed only while the key is active (and still has
    ``key_digest``, the digest its caller presented, if given), and the amount is also
    reserved, in the same transaction, within their budgets, on the key's row and on
    its member's where they have budgets (the others are only read).
    Holds left behind by dead workers are released first when they stand in the way.

    :raise KeyRevoked: the key was revoked since its caller was found.
    :raise InvalidKey: the key was deleted or rotated since its caller was found.
    :raise HoldVoided: ``hold_id`` was voided: its request was given up (void_hold).
    """
    now = utcnow()
    hold = {
        "id": hold_id or secrets.token_hex(16),
        "account_id": account_id,
        "amount": amount,
        "api_key_id": key_id,
        "status": OPEN,
        "created_at": now,
        "expires_at": now + timedelta(seconds=ttl_seconds),
        "key_window_start": None,
        "member_window_start": None,
        "reserved_on_key": False,
        "reserved_on_member": False,
    }
    windows = window_parameters(now)
    outcome = _try_hold(hold, windows, key_digest)
    if outcome != _HELD and release_expired_holds(account_id=account_id):
        outcome = _try_hold(hold, windows, key_digest)
    if outcome == _BALANCE_SHORT:
        money = account_money(account_id)
        return Shortfall(requested=amount, available=money.available, balance=money.balance)
    if outcome == _KEY_REFUSED:
        return _key_shortfall(key_id, key_digest, amount)
    if outcome == _MEMBER_REFUSED:
        return _member_shortfall(key_id, amount)
    return HeldCredit(id=hold["id"], account_id=account_id, amount=amount, key_id=key_id)


class _HoldRefused(Exception):
    """Raised by a hold's step that did not apply, so that its transaction is rolled back."""

    def __init__(self, outcome: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome


def _try_hold(hold: dict[str, Any], windows: dict[str, int], key_digest: str | None) -> str:
    """Reserve on the account, the key, the member, then record the hold: all of it or none.

    The hold's row notes the starts of the windows its key and member counted it in.
    """
    try:
        return write_transaction(
            lambda connection: _hold_steps(connection, hold, windows, key_digest),
            alone=lambda: _hold_alone(hold, windows, key_digest),
        )
    except _HoldRefused as refused:
        return refused.outcome
    except IntegrityError:
        status = hold_status(hold["id"])
        if status == VOIDED:
            raise HoldVoided(hold["id"]) from None
        if status == OPEN:
            # The hold's statement was applied but its answer was lost with its
            # connection, and it ran again (execute_alone): the open hold under this
            # request's own id is the one it placed, reserved once.
            return _HELD
        raise


def _hold_steps(
    connection: Connection, hold: dict[str, Any], windows: dict[str, int], key_digest: str | None
) -> str:
    reserved = execute_on_driver(
        connection,
        hold_sql.reserve_on_account(guards.ACCOUNT_COVERS),
        {"account_id": hold["account_id"], "amount": hold["amount"]},
    )
    if reserved != 1:
        raise _HoldRefused(_BALANCE_SHORT)
    key_id = hold["api_key_id"]
    if key_id is not None and key_id not in _keys_reserved_on:
        # A key and member without budgets: the hold's row, written from what it reads.
        parameters = _hold_parameters(hold, windows, key_digest)
        if execute_on_driver(connection, hold_sql.INSERT_HOLD_RESERVING_NOTHING, parameters):
            return _HELD
    if key_id is not None:
        _reserve_on_key_and_member(connection, hold, windows, key_digest)
        _keys_reserved_on.note(key_id, hold["reserved_on_key"] or hold["reserved_on_member"])
    execute_on_driver(connection, hold_sql.INSERT_HOLD, hold)
    return _HELD


def _reserve_on_key_and_member(
    connection: Connection, hold: dict[str, Any], windows: dict[str, int], key_digest: str | None
) -> None:
    """Reserve the hold on its key and its member where they have budgets; note their windows.

    A row without a budget (guards.reserves_on) is only read: its window is noted,
    and its reservation left out, as the hold's row says.
    """
    parameters = {"key_id": hold["api_key_id"], **windows}
    rows = fetch_on_driver(
        connection, hold_sql.KEY_AND_MEMBER_TO_HOLD, {**parameters, "key_digest": key_digest}
    )
    if not rows:
        raise _HoldRefused(_KEY_REFUSED)
    read = rows[0]
    hold.update(key_window_start=read.key_window, member_window_start=read.member_window)
    parameters["amount"] = hold["amount"]
    if read.key_reserves:
        on_key = hold_sql.reserve_on_key(guards.KEY_WITHIN_LIMIT)
        on_key_parameters = {**parameters, "key_digest": key_digest}
        hold["key_window_start"] = _reserve(connection, on_key, on_key_parameters, _KEY_REFUSED)
        hold["reserved_on_key"] = True
    if read.member_reserves:
        on_member = hold_sql.reserve_on_member(guards.MEMBER_WITHIN_BUDGET)
        hold["member_window_start"] = _reserve(connection, on_member, parameters, _MEMBER_REFUSED)
        hold["reserved_on_member"] = True


def _reserve(
    connection: Connection, statement: Any, parameters: dict[str, Any], refused: str
) -> int:
    """Run a reservation on a key or a member; return the start of the window it counts in.

    :raise _HoldRefused: with ``refused``, when the row's guard did not let it.
    """
    rows = fetch_on_driver(connection, statement, parameters)
    if not rows:
        raise _HoldRefused(refused)
    return rows[0][0]


class _KeysReservedOn:
    """The keys whose last hold in this process reserved on the key's or its member's row.

    Their holds go straight to the statements that reserve (hold_in_one_statement, or
    the steps that read the rows and reserve); any other key's first try the one that
    reserves nothing (hold_without_reservations, INSERT_HOLD_RESERVING_NOTHING), which
    places nothing if a row needs a reservation after all. A key forgotten, or
    remembered after its budget is gone, costs a statement, never a wrong hold.
    """

    MOST = 10_000

    def __init__(self) -> None:
        self._ids: set[int] = set()

    def __contains__(self, key_id: int) -> bool:
        return key_id in self._ids

    def note(self, key_id: int, reserved: bool) -> None:
        """Remember whether the hold just placed with ``key_id`` reserved on a row."""
        if not reserved:
            self._ids.discard(key_id)
            return
        if len(self._ids) >= self.MOST:
            self._ids.clear()
        self._ids.add(key_id)


_keys_reserved_on = _KeysReservedOn()


def _hold_alone(hold: dict[str, Any], windows: dict[str, int], key_digest: str | None) -> str:
    """Do what _hold_steps does in one statement, alone."""
    key_id = hold["api_key_id"]
    if key_id is not None and key_id not in _keys_reserved_on:
        outcome = _hold_reserving_nothing(hold, windows, key_digest)
        if outcome is not None:
            return outcome
    statement, parameters = hold_statement(hold, windows, key_digest)
    matched = execute_alone(statement, parameters, prepared=True)[0]
    if matched[0] != 1:
        return _BALANCE_SHORT
    if key_id is not None:
        if matched[1] != 1:
            return _KEY_REFUSED
        if matched[2] != 1:
            return _MEMBER_REFUSED
        _keys_reserved_on.note(key_id, matched[3])
    return _HELD


def _hold_reserving_nothing(
    hold: dict[str, Any], windows: dict[str, int], key_digest: str | None
) -> str | None:
    """Place the hold if its key and member need no reservation.

    Return how it ended; None if the key or member did not let it, for the statement
    that reserves to say why (it checks the balance first, as the steps do) or hold.
    """
    statement = hold_sql.hold_without_reservations(guards.ACCOUNT_COVERS)
    parameters = _hold_parameters(hold, windows, key_digest)
    placed, passed = execute_alone(statement, parameters, prepared=True)[0][:2]
    if placed == 1:
        return _HELD
    return _BALANCE_SHORT if passed == 1 else None


def hold_statement(
    hold: dict[str, Any], windows: dict[str, int], key_digest: str | None = None
) -> tuple[Any, dict[str, Any]]:
    """Return the one statement placing ``hold`` (a holds row's values), and its parameters."""
    with_key = hold["api_key_id"] is not None
    statement = hold_sql.hold_in_one_statement(
        guards.ACCOUNT_COVERS,
        guards.KEY_WITHIN_LIMIT if with_key else None,
        guards.MEMBER_WITHIN_BUDGET if with_key else None,
    )
    return statement, _hold_parameters(hold, windows, key_digest)


def _hold_parameters(
    hold: dict[str, Any], windows: dict[str, int], key_digest: str | None
) -> dict[str, Any]:
    """Return the parameters of a hold's one statement, either shape."""
    return {
        "hold_id": hold["id"],
        "holder_id": hold["account_id"],
        "amount": hold["amount"],
        "key_id": hold["api_key_id"],
        "key_digest": key_digest,
        "placed_at": hold["created_at"],
        "expires_at": hold["expires_at"],
        **windows,
    }


def _key_shortfall(key_id: int, key_digest: str | None, amount: Decimal) -> BudgetShortfall:
    """Return what the key's budget leaves, once sure the key itself may be used.

    :raise KeyRevoked, InvalidKey: as place_hold.
    """
    key = key_money(key_id)
    if key is not None and key.state == REVOKED:
        raise KeyRevoked()
    if key is None or key.state != ACTIVE or key_digest not in (None, key.digest):
        # The key's row was removed, or the key deleted or rotated, after its caller was found.
        raise InvalidKey()
    return key.shortfall(amount, KEY_BUDGET)


def _member_shortfall(key_id: int, amount: Decimal) -> BudgetShortfall:
    """Return what the budget of the key's member leaves."""
    return member_money(key_id).shortfall(amount, MEMBER_BUDGET)


def settle_hold(
    hold: HeldCredit,
    *,
    cost: Decimal,
    generation_id: str,
    record: BoundStatement | None = None,
    rollup: Rollup | None = None,
) -> Decimal:
    """Replace ``hold`` by a charge of ``cost``; return the charge.

    ``record`` is written with the charge or not at all: an INSERT (the generation's
    record) and its row, in which the ledger fills in ``cost``, what was charged, and
    ``shortfall``, what was not. A row that names a key whose row is gone (deleted
    outright while the request ran) is written without it, so that the charge is never
    lost with its record. ``rollup`` adds the request, its tokens and its charge to its
    hour's totals, in the same transaction.

    A cost above the hold (or a hold that expired meanwhile) is charged as far as the
    balance and the budgets of the key and its member allow, never below zero or past a
    budget; what is left unpaid is logged, and is the record's shortfall. A hold placed
    on a key gives back what it reserved on the key and its member, its charge counts
    in the windows it was placed in, and the key is recorded as used.

    A settlement is never given up for a database that does not answer: it is tried
    again, on another connection, until it commits (or the process ends, and the sweeper
    settles the hold when it expires). A try that failed may have committed all the
    same (the connection was lost during the COMMIT): each try after the first asks the
    hold first, and a hold found settled is not charged again.
    """
    charge = _settle_until_committed(hold, cost, _Writes(generation_id, record, rollup))
    if charge < cost:
        log.warning(
            "generation %s priced at $%s but only $%s could be charged: $%s unpaid",
            generation_id,
            cost,
            charge,
            cost - charge,
        )
    return charge


@dataclass(frozen=True)
class _Writes:
    """What a settlement writes beside the money: the charge's generation, record, rollup."""

    generation_id: str
    record: BoundStatement | None
    rollup: Rollup | None
    # The record names no key (its key's row is gone): its rollup is filed under NO_KEY
    # too, so that the two agree.
    keyless: bool = False

    def without_key(self) -> _Writes:
        """Return these writes, the record naming no key."""
        statement, row = self.record
        return replace(self, record=(statement, {**row, "api_key_id": None}), keyless=True)


def _settle_until_committed(hold: HeldCredit, cost: Decimal, writes: _Writes) -> Decimal:
    pause, longest = SETTLE_RETRY_PAUSES
    tries = 0
    while True:
        try:
            if tries and (charged := settled_charge(hold.id, writes.generation_id)) is not None:
                return charged
            return _settle_with_record(hold, cost, writes)
        except AlreadyRecorded:
            if not tries:
                raise
            # An earlier try committed after all (its hold had been released): its record
            # and its charge are there.
            return _charged(writes.generation_id)
        except RETRYABLE_ERRORS as error:
            tries += 1
            log.warning(
                "generation %s: its settlement failed (%s, try %d); trying again in %.2f s",
                writes.generation_id,
                failure_reason(error),
                tries,
                pause,
            )
        time.sleep(pause)
        pause = min(pause * 2, longest)


def settled_charge(hold_id: str, generation_id: str) -> Decimal | None:
    """Return what the settlement of ``hold_id`` charged, or None if it is not settled."""
    if hold_status(hold_id) != SETTLED:
        return None
    return _charged(generation_id)


_HOLD_STATUS = select(Hold.status).where(Hold.id == bindparam("hold_id"))


def hold_status(hold_id: str, *, connection: Connection | None = None) -> str | None:
    """Return the status of the hold ``hold_id``; None if there is no such hold."""
    row = _read_one(_HOLD_STATUS, _HOLD_STATUS, connection, hold_id=hold_id)
    return row.status if row is not None else None


def _charged(generation_id: str) -> Decimal:
    """Return what the ledger charged for ``generation_id`` (0: nothing)."""
    charged = db.session.scalar(
        select(LedgerEntry.amount).where(LedgerEntry.generation_id == generation_id)
    )
    db.session.commit()
    return -charged if charged is not None else Decimal(0)


def _settle_with_record(hold: HeldCredit, cost: Decimal, writes: _Writes) -> Decimal:
    """Settle with the record, or without the key it names if that key's row is gone."""
    try:
        return _settle_once(hold, cost, writes)
    except IntegrityError:
        if writes.record is None or writes.record[1].get("api_key_id") is None:
            raise
        log.warning(
            "generation %s: its record names a key that is gone; recorded without it",
            writes.generation_id,
        )
        return _settle_once(hold, cost, writes.without_key())


def _settle_once(hold: HeldCredit, cost: Decimal, writes: _Writes) -> Decimal:
    """Settle in one transaction, durable when it returns; a covered cost as one statement alone."""

    def steps(connection: Connection) -> Decimal:
        return _settle_steps(connection, hold, cost, writes)

    def alone() -> Decimal | None:
        return _settle_covered_alone(hold, cost, writes)

    # Step by step, the settlement locks the account's row, which every request paying
    # from the account needs: it must not keep it through a disk write (durable_after_unlock).
    return write_transaction(
        steps, alone=alone if cost <= hold.amount else None, durable_after_unlock=True
    )


def _settle_covered_alone(hold: HeldCredit, cost: Decimal, writes: _Writes) -> Decimal | None:
    """Charge ``cost`` (at most the hold) with its record, if the hold is still open.

    Return the charge; None if the hold was not open, and nothing was applied. One
    statement, durable when it returns: its record and rollup are written with the
    charge or not at all.
    """
    shape = None
    parameters = {}
    if writes.record is not None:
        statement, row = writes.record
        row = _with_charge(row, cost, cost)
        shape = (statement, tuple(row))
        parameters = {settlement_sql.RECORD_PREFIX + name: value for name, value in row.items()}
    if writes.rollup is not None and writes.record is None:
        # With a record, the rollup takes the record's values (settlement_sql._rollup_step).
        parameters.update(_rollup_parameters(hold, writes, cost, cost))
    now = utcnow()
    parameters.update(
        hold_id=hold.id,
        charge=cost,
        released=hold.amount,
        key_id=hold.key_id,
        used_at=now,
        used_micros=epoch_micros(now),
        generation_id=writes.generation_id,
    )
    if hold.key_id is not None:
        # The windows the key's and member's rows roll over to, if one began since.
        parameters.update(window_parameters(now))
    statement = settlement_sql.settlement_in_one_statement(
        hold.key_id is not None, cost > 0, shape, writes.rollup is not None
    )
    closed = execute_durably(statement, parameters)[0][0]
    return cost if closed == 1 else None


def _settle_steps(
    connection: Connection, hold: HeldCredit, cost: Decimal, writes: _Writes
) -> Decimal:
    """Close the hold, charge the balance and the budget windows, record the charge; return it."""
    released = execute_on_driver(
        connection, guards.CLOSE_HOLD, {"hold_id": hold.id, "status": SETTLED}
    )
    if released != 1 and writes.record is not None:
        _refuse_if_recorded(connection, writes.record)
    # An expired hold was released by the sweeper: nothing of it is reserved any more.
    reserved = hold.amount if released == 1 else Decimal(0)
    if released != 1 and hold_status(hold.id, connection=connection) == VOIDED:
        # Its request was given up for another, which is charged instead (void_hold).
        log.warning("generation %s: it was given up for another while it ran", hold.id)
        charge = Decimal(0)
    else:
        charge = cost if cost <= reserved else _payable(connection, hold, cost, reserved)
    now = utcnow()
    if charge > 0:
        _append_entry(
            connection,
            account_id=hold.account_id,
            kind=CHARGE,
            amount=-charge,
            generation_id=writes.generation_id,
            released=reserved,
        )
    else:
        debit = {"account_id": hold.account_id, "charge": charge, "released": reserved}
        execute_on_driver(connection, guards.DEBIT, debit)
    if hold.key_id is not None:
        spent = {"hold_id": hold.id, "key_id": hold.key_id, "charge": charge, "released": reserved}
        spent.update(window_parameters(now))
        execute_on_driver(connection, settlement_sql.SPEND_ON_KEY, {**spent, "used_at": now})
        execute_on_driver(connection, settlement_sql.SPEND_ON_MEMBER, spent)
    if writes.record is not None:
        statement, row = writes.record
        execute_on_driver(connection, statement, _with_charge(row, cost, charge))
    if writes.rollup is not None:
        parameters = _rollup_parameters(hold, writes, cost, charge)
        execute_on_driver(connection, settlement_sql.ROLL_UP, parameters)
    return charge


def _refuse_if_recorded(connection: Connection, record: BoundStatement) -> None:
    """Raise AlreadyRecorded if ``record``'s row (by its id alone) is there already.

    A hold found not open was settled or released before: its generation may be recorded
    already, and a record's id is unique only with its time where the table is
    partitioned by time. Its row is looked for in every partition.
    """
    statement, row = record
    table = statement.table
    if connection.execute(select(table.c.id).where(table.c.id == row["id"])).first():
        raise AlreadyRecorded(f"generation {row['id']} is recorded already")


def _with_charge(row: dict[str, Any], cost: Decimal, charge: Decimal) -> dict[str, Any]:
    """Return the record's row with what was charged and what was left unpaid."""
    return {**row, "cost": charge, "shortfall": cost - charge}


def _rollup_parameters(
    hold: HeldCredit, writes: _Writes, cost: Decimal, charge: Decimal
) -> dict[str, Any]:
    """Return ROLL_UP's parameters: one request, its tokens, its charge and shortfall."""
    prefix = settlement_sql.ROLLUP_PREFIX
    rollup = writes.rollup
    keyless = writes.keyless or hold.key_id is None
    return {
        prefix + "account_id": hold.account_id,
        prefix + "api_key_id": NO_KEY if keyless else hold.key_id,
        prefix + "model": rollup.model,
        prefix + "hour": rollup.hour,
        prefix + "requests": 1,
        prefix + "prompt_tokens": rollup.prompt_tokens,
        prefix + "cached_tokens": rollup.cached_tokens,
        prefix + "completion_tokens": rollup.completion_tokens,
        prefix + "reasoning_tokens": rollup.reasoning_tokens,
        prefix + "cost": charge,
        prefix + "shortfall": cost - charge,
    }


def _payable(connection: Connection, hold: HeldCredit, cost: Decimal, reserved: Decimal) -> Decimal:
    """Return how much of ``cost`` can be charged beyond what is still ``reserved``.

    The rows are locked, account first, so that the room read is the room charged.
    """
    room = max(account_money(hold.account_id, connection=connection).available, Decimal(0))
    payable = min(cost, reserved + room)
    if hold.key_id is None:
        return payable
    # A budget's room is what it allows beyond what the hold reserved on its row; a row
    # the hold did not reserve on (it had no budget when the hold was placed) allows it
    # nothing of the hold's own.
    on_key, on_member = (False, False)
    if reserved:
        on_key, on_member = connection.execute(
            settlement_sql.HOLD_RESERVATIONS, {"hold_id": hold.id}
        ).one()
    key = key_money(hold.key_id, connection=connection)
    member = member_money(hold.key_id, connection=connection)
    for money, reserved_on in ((key, on_key), (member, on_member)):
        allowance = money and money.allowance
        if allowance is not None:
            payable = min(payable, (reserved if reserved_on else 0) + allowance)
    return payable


def extend_holds(hold_ids: Sequence[str], *, ttl_seconds: int) -> int:
    """Push the expiry of the open holds among ``hold_ids`` forward; return how many."""
    expires_at = utcnow() + timedelta(seconds=ttl_seconds)

    def extend(connection: Connection) -> int:
        extended = 0
        for start in range(0, len(hold_ids), EXTEND_BATCH):
            batch = list(hold_ids[start : start + EXTEND_BATCH])
            parameters = {"hold_ids": batch, "expires_at": expires_at}
            extended += connection.execute(expiry_sql.EXTEND_HOLDS, parameters).rowcount
        return extended

    return write_transaction(extend)


def record_progress(progress_by_hold: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Keep each open hold's ``progress``: what its stream delivered, priced if it dies.

    One statement for all of them, in one transaction.
    """
    if not progress_by_hold:
        return
    rows = [{"hold_id": hold_id, "progress": progress} for hold_id, progress in progress_by_hold]
    write_transaction(lambda connection: connection.execute(expiry_sql.RECORD_PROGRESS, rows))


def record_first_progress(hold_id: str, progress: dict[str, Any]) -> None:
    """Keep a stream's progress before its first output goes out: one row, on the driver.

    record_progress's UPDATE, handed to the driver: SQLAlchemy's execution of it (its
    many-rows form, its cache lookup, its result) cost more than the statement, once
    for every stream. On PostgreSQL it runs alone, prepared, on a kept connection.
    """
    parameters = {"hold_id": hold_id, "progress": progress}
    write_transaction(
        lambda connection: execute_on_driver(connection, expiry_sql.RECORD_PROGRESS, parameters),
        alone=lambda: len(
            execute_alone(expiry_sql.RECORD_PROGRESS_ALONE, parameters, prepared=True)
        ),
    )


def expired_holds_with_progress(*, limit: int = 500) -> list[tuple[HeldCredit, dict[str, Any]]]:
    """Return open holds past their expiry whose stream recorded progress, with it.

    Their worker died while they streamed: they are settled at their progress
    (``app.generations.lifecycle.settle_interrupted``), not released.
    """
    rows = db.session.execute(
        select(*_HELD_CREDIT, Hold.progress)
        .where(Hold.status == OPEN, Hold.expires_at < utcnow(), Hold.progress.is_not(None))
        .limit(limit)
    ).all()
    db.session.commit()
    return [(HeldCredit(*row[:-1]), row.progress) for row in rows]


# A hold's columns, in HeldCredit's order.
_HELD_CREDIT = (Hold.id, Hold.account_id, Hold.amount, Hold.api_key_id)


def release_expired_holds(*, account_id: int | None = None, limit: int = 500) -> int:
    """Release open holds past their expiry (their worker died); return how many.

    A hold whose stream recorded progress is left to be settled at it (see
    ``expired_holds_with_progress``).
    """
    query = select(*_HELD_CREDIT).where(
        Hold.status == OPEN, Hold.expires_at < utcnow(), Hold.progress.is_(None)
    )
    if account_id is not None:
        query = query.where(Hold.account_id == account_id)
    expired = db.session.execute(query.limit(limit)).all()
    db.session.commit()
    released = 0
    for row in expired:
        held = HeldCredit(*row)
        released += write_transaction(lambda connection, held=held: _expire(connection, held))
    return released


def _expire(connection: Connection, hold: HeldCredit) -> int:
    closed = execute_on_driver(
        connection, guards.CLOSE_HOLD, {"hold_id": hold.id, "status": EXPIRED}
    )
    if closed != 1:
        return 0
    execute_on_driver(
        connection,
        guards.DEBIT,
        {"account_id": hold.account_id, "charge": 0, "released": hold.amount},
    )
    if hold.key_id is not None:
        released = {"hold_id": hold.id, "key_id": hold.key_id, "amount": hold.amount}
        execute_on_driver(connection, expiry_sql.RELEASE_ON_KEY, released)
        execute_on_driver(connection, expiry_sql.RELEASE_ON_MEMBER, released)
    return 1


def void_hold(connection: Connection, *, hold_id: str, account_id: int, seen: str | None) -> bool:
    """Make sure the hold ``hold_id``, found ``seen`` (None: not placed), never charges.

    For a request given up for another (a retry took its Idempotency-Key over): its
    worker may only have stalled past the hold's TTL, and run on. A hold not placed is
    placed voided, so that its request cannot place it (place_hold raises HoldVoided);
    an expired one is voided, so that a settlement that comes after all charges nothing.
    Return False if the hold is no longer as it was seen (its request placed it, or
    settled it, since): the request is alive. In the caller's transaction.
    """
    if seen is None:
        now = utcnow()
        dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
        placed = (
            dialect.insert(Hold)
            .values(
                id=hold_id,
                account_id=account_id,
                amount=Decimal(0),
                status=VOIDED,
                created_at=now,
                expires_at=now,
            )
            .on_conflict_do_nothing(index_elements=[Hold.id])
            # Its row, not its count: a driver need not count an INSERT's rows.
            .returning(Hold.id)
        )
        return connection.execute(placed).first() is not None
    if seen == EXPIRED:
        voided = update(Hold).where(Hold.id == hold_id, Hold.status == EXPIRED)
        return connection.execute(voided.values(status=VOIDED)).rowcount == 1
    return seen in (SETTLED, VOIDED)


@dataclass(frozen=True)
class AccountMoney:
    """An account's balance and what its open holds reserve of it."""

    balance: Decimal
    reserved: Decimal

    @property
    def available(self) -> Decimal:
        """What new holds may still reserve."""
        return self.balance - self.reserved


@dataclass(frozen=True)
class BudgetMoney:
    """A budget (None: none), what was spent in its current window, what holds reserve."""

    budget: Decimal | None
    spent: Decimal
    reserved: Decimal
    window: str

    @property
    def allowance(self) -> Decimal | None:
        """What may still be held or charged in this window; None: there is no budget."""
        if self.budget is None:
            return None
        return max(self.budget - self.spent - self.reserved, Decimal(0))

    def shortfall(self, amount: Decimal, holder: str) -> BudgetShortfall:
        """Return why a hold of ``amount`` did not fit this budget (``holder``'s)."""
        return BudgetShortfall(
            requested=amount,
            available=self.allowance or Decimal(0),
            budget=self.budget or Decimal(0),
            window=self.window,
            holder=holder,
        )


@dataclass(frozen=True)
class KeyMoney(BudgetMoney):
    """A key's budget, and its state and digest."""

    state: str = ACTIVE
    digest: str = ""


def account_money(account_id: int, *, connection: Connection | None = None) -> AccountMoney:
    """Return the account's money; on ``connection`` (a settlement's), its row locked."""
    row = _read_one(
        balance_sql.ACCOUNT_MONEY,
        balance_sql.LOCKED_ACCOUNT_MONEY,
        connection,
        account_id=account_id,
    )
    return AccountMoney(*row)


def key_money(key_id: int, *, connection: Connection | None = None) -> KeyMoney | None:
    """Return the key's money (None: its row is gone); on ``connection``, its row locked."""
    row = _read_one(
        balance_sql.KEY_MONEY,
        balance_sql.LOCKED_KEY_MONEY,
        connection,
        key_id=key_id,
        **window_parameters(utcnow()),
    )
    if row is None:
        return None
    return KeyMoney(
        row.budget, row.spent, row.window_reserved, row.budget_window, row.state, row.digest
    )


def member_money(key_id: int, *, connection: Connection | None = None) -> BudgetMoney | None:
    """Return the money of key ``key_id``'s member; on ``connection``, the row locked."""
    row = _read_one(
        balance_sql.MEMBER_MONEY,
        balance_sql.LOCKED_MEMBER_MONEY,
        connection,
        key_id=key_id,
        **window_parameters(utcnow()),
    )
    return None if row is None else BudgetMoney(*row)


def _read_one(unlocked: Any, locked: Any, connection: Connection | None, **parameters: Any) -> Any:
    if connection is not None:
        return connection.execute(locked, parameters).first()
    row = db.session.execute(unlocked, parameters).first()
    db.session.commit()
    return row


@dataclass(frozen=True)
class CreditSummary:
    """An account's money at a glance, in USD."""

    granted: Decimal
    used: Decimal
    balance: Decimal


def credit_summary(account_id: int) -> CreditSummary:
    """Return what was granted to and charged from the account, and its balance.

    The grants are summed (through an index of grants alone), and what was charged is
    what they leave beyond the balance, which is the ledger's sum: however many charges
    the account has, they are not read.
    """
    # A literal, so that the planner sees the partial index's own condition.
    granted = (
        select(func.sum(LedgerEntry.amount))
        .where(LedgerEntry.account_id == Account.id, LedgerEntry.kind == literal_column("'grant'"))
        .scalar_subquery()
    )
    balance, total = db.session.execute(
        select(Account.balance, granted).where(Account.id == account_id)
    ).one()
    db.session.commit()
    total = total or Decimal(0)
    return CreditSummary(granted=total, used=total - balance, balance=balance)
