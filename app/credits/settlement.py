"""Settlement: a hold replaced by its charge, once, with the generation's record and rollup.

A settlement closes the hold, charges the account (a chained entry, app.credits.entries)
and gives back what the hold reserved, moves what it reserved on its key and member to
the spend of the windows it was placed in, and writes the generation's record and its
hour's rollup: all of it in one transaction, or, for a hold that covers its cost on a
database whose statements run alone (PostgreSQL), as one statement
(app.credits.sql.settlement). A cost beyond the hold is charged as far as the balance and
the budgets allow. A settlement is tried again until it commits, and never charges twice.
The settlement counts every charge in its key's and member's windows, whether the row has
a budget or not, so that ``window_spent`` is exact, and a budget set later starts from the
window's true spend.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError

from app.budgets import window_parameters
from app.credits.balances import HeldCredit, account_money, hold_status, key_money, member_money
from app.credits.chain import epoch_micros
from app.credits.entries import append_entry
from app.credits.errors import AlreadyRecorded
from app.credits.models import CHARGE, NO_KEY, SETTLED, VOIDED, LedgerEntry
from app.credits.sql import guards
from app.credits.sql import settlement as settlement_sql
from app.database import (
    BoundStatement,
    execute_durably,
    execute_on_driver,
    failure_reason,
    utcnow,
    write_transaction,
)
from app.extensions import db

log = logging.getLogger(__name__)

# Errors that say nothing was (or may not have been) committed, and another try can mend:
# a lost connection, a server going away or restarting, a lock not granted in time.
RETRYABLE_ERRORS = (OperationalError, InterfaceError)
# Seconds between a settlement's tries: doubling from the first to the last.
SETTLE_RETRY_PAUSES = (0.05, 5.0)


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
        append_entry(
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
