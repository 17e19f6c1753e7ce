"""Holds: credit set aside for a request's worst case, on its account, key and member at once.

A hold reserves on the account's row, conditional on ``balance - reserved`` staying at or
above zero. A key or member with a budget is held to it the same way: a hold is also
reserved on its row, conditional on the window's spend plus what its open holds reserve
staying within the budget, and settlement moves that reservation to the spend of the
budget window the hold was placed in (app.budgets, app.credits.settlement). A key or
member without a budget is never written by a hold (the key as its caller presented
it): a reservation there would protect nothing, and writing the row on every hold
doubled its writes; on PostgreSQL a hold that reserves on one of the two rows locks both
(one read each, sql.holds.hold_in_one_statement). Each hold notes whether it reserved on
its key and on its member, and whatever ends it (settlement, expiry) releases exactly
that, so that ``window_reserved`` is the sum of the open holds that reserved on the row;
a budget put on a row in use takes over its running requests' holds from that moment
(app.accounts.budgets says how budgets set or removed meanwhile are counted). Rows are
taken account first, then key, then member, so that two transactions never wait on each
other's.

A hold is offered to the database in two shapes built from the same guards
(app.credits.sql): its steps, run in one transaction, and one statement that applies all
of them or none, which a database whose statements run alone (PostgreSQL) runs instead:
one round trip, its rows locked only while it runs.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.auth.errors import InvalidKey, KeyRevoked
from app.auth.models import ACTIVE, REVOKED
from app.budgets import window_parameters
from app.credits.balances import (
    KEY_BUDGET,
    MEMBER_BUDGET,
    BudgetShortfall,
    HeldCredit,
    Shortfall,
    account_money,
    hold_status,
    key_money,
    member_money,
)
from app.credits.errors import HoldVoided
from app.credits.expiry import release_expired_holds
from app.credits.models import OPEN, VOIDED
from app.credits.sql import guards
from app.credits.sql import holds as hold_sql
from app.database import (
    execute_alone,
    execute_on_driver,
    fetch_on_driver,
    utcnow,
    write_transaction,
)

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
