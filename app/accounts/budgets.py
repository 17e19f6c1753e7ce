"""Setting and clearing the budgets of keys and members: an amount in USD a window.

The ledger holds every request to them (``app.credits.holds``); this module only
changes them. A budget whose window changes starts counting the new window from what
its keys' requests placed in it so far were charged (and will be, for those still
running); a ``5h`` window starts with the next request.

A hold reserves on a key's or member's row only while it has a budget (or a rolling
window), and notes whether it did (``Hold.reserved_on_key``, ``reserved_on_member``);
what ends it gives back exactly what it noted, so the counters stay exact whatever
changes meanwhile:

- A budget set on a row takes over the holds of its keys' running requests that did
  not reserve on it (``take_over_open_holds``): their amounts join its
  ``window_reserved`` and they are noted as reserved there, so that new requests leave
  room for them, as if the row had always been reserved on. On PostgreSQL a hold
  placed while the budget is being set (its statement read the row before the budget
  was committed, and committed after the holds were taken over) is not taken over: it
  releases nothing when it ends, and its charge counts in the window's spend like any
  other, so the budget can be passed by at most what such holds are charged.
- A budget removed leaves the reservations of the holds that made them: each is
  released when its hold ends, and ``window_reserved`` is back at zero once none of
  them runs. New holds no longer reserve on the row.

A key's budget set by an owner, an admin or the operator is locked
(``ApiKey.budget_locked``): the key's member may lower it, not raise it, remove it or
move it to another window (``checked_lock``). A budget a member set on their own key
where none was stays theirs to change.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy import false, func, select, true, update

from app.accounts.changes import record_change
from app.accounts.errors import InvalidKeyLimits, KeyNotFound
from app.accounts.models import ADMIN, OWNER, Membership
from app.auth.keys import forget_remembered_callers
from app.auth.models import DELETED, ApiKey
from app.budgets import ROLLING_MICROS, WINDOWS, BudgetCounters, calendar_start, unix_micros
from app.credits.models import CHARGE, OPEN, Hold, LedgerEntry
from app.database import again_after_deadlock, utcnow
from app.extensions import db

LIMIT_DECIMAL_PLACES = 6
LIMIT_QUANTUM = Decimal(1).scaleb(-LIMIT_DECIMAL_PLACES)
# Money is stored as a 64-bit count of 1e-10 USD; a budget stays well within it.
MAX_BUDGET = Decimal(100_000_000)


def checked_window(window: str) -> str:
    """Return ``window`` if it names a budget window; raise InvalidKeyLimits otherwise."""
    if window not in WINDOWS:
        raise InvalidKeyLimits(f"the budget window must be one of {', '.join(WINDOWS)}: {window!r}")
    return window


def set_key_budget(
    key_id: int,
    *,
    amount: Decimal | None,
    window: str,
    account_id: int | None = None,
    actor: int | None = None,
) -> ApiKey:
    """Give key ``key_id`` a budget of ``amount`` USD a ``window`` (None: no budget).

    ``actor`` is the person who asked (None: the operator), for the audit log.

    :raise InvalidKeyLimits: the amount or the window is not valid.
    :raise KeyNotFound: no key has ``key_id`` (of the organisation ``account_id``, if given).
    """
    amount, window = checked_budget_amount(amount), checked_window(window)

    def change() -> ApiKey:
        taken_over = take_over_open_holds(Hold.reserved_on_key, [key_id], amount)
        key = db.session.scalar(
            select(ApiKey)
            .where(ApiKey.id == key_id, ApiKey.state != DELETED)
            .where(ApiKey.account_id == account_id if account_id is not None else true())
            .with_for_update()
        )
        if key is None:
            db.session.rollback()
            raise KeyNotFound(f"no API key with id {key_id}")
        key.budget_locked = checked_lock(key, amount, window, actor)
        apply_budget(key, amount, window, [key.id], taken_over)
        _record(actor, key.account_id, f"key:{key.id}", amount, window)
        db.session.commit()
        return key

    key = again_after_deadlock(change)
    forget_remembered_callers()
    return key


def lifts_limits(actor: int | None, account_id: int) -> bool:
    """Tell whether ``actor`` may lift any key's limit: the operator (None), an owner, an admin."""
    if actor is None:
        return True
    role = db.session.scalar(
        select(Membership.role).where(
            Membership.account_id == account_id,
            Membership.person_id == actor,
            Membership.removed_at.is_(None),
        )
    )
    return role in (OWNER, ADMIN)


def checked_lock(key: ApiKey, amount: Decimal | None, window: str, actor: int | None) -> bool:
    """Return whether ``key``'s budget set to ``amount`` a ``window`` by ``actor`` is locked.

    An owner, an admin or the operator locks the budget they set. A member may lower a
    locked budget, which stays locked; raising, removing or moving it to another window
    rolls the transaction back and raises InvalidKeyLimits.
    """
    if lifts_limits(actor, key.account_id):
        return amount is not None
    if not key.budget_locked:
        return False
    if amount is None or window != key.budget_window or amount > key.budget:
        db.session.rollback()
        raise InvalidKeyLimits(
            f"an owner or admin set this key's limit of ${key.budget:f} a {key.budget_window}: "
            "you may lower it, but only they may raise it, remove it or change its window"
        )
    return True


def set_member_budget(
    member_id: int, *, amount: Decimal | None, window: str, actor: int | None = None
) -> Membership:
    """Give member ``member_id`` a budget of ``amount`` USD a ``window`` (None: no budget).

    The member's keys all count against it. ``actor`` is the person who asked (None:
    the operator), for the audit log.

    :raise InvalidKeyLimits: the amount or the window is not valid.
    :raise KeyNotFound: no member has ``member_id``.
    """
    amount, window = checked_budget_amount(amount), checked_window(window)

    def change() -> Membership:
        keys_of_member = select(ApiKey.id).where(ApiKey.member_id == member_id)
        key_ids = list(db.session.scalars(keys_of_member))
        taken_over = take_over_open_holds(Hold.reserved_on_member, key_ids, amount)
        member = db.session.scalar(
            select(Membership).where(Membership.id == member_id).with_for_update()
        )
        if member is None:
            db.session.rollback()
            raise KeyNotFound(f"no member with id {member_id}")
        apply_budget(member, amount, window, key_ids, taken_over)
        _record(actor, member.account_id, f"member:{member.id}", amount, window)
        db.session.commit()
        return member

    return again_after_deadlock(change)


def _record(
    actor: int | None, account_id: int, subject: str, amount: Decimal | None, window: str
) -> None:
    """Log the change of a budget in the organisation's audit log."""
    detail = {"amount": None if amount is None else f"{amount:f}", "window": window}
    record_change(actor, account_id, "budget.set", subject, detail)


def take_over_open_holds(reserved_on: Any, key_ids: list[int], amount: Decimal | None) -> Decimal:
    """Note the open holds of ``key_ids`` as reserved on a row given a budget; return their sum.

    apply_budget adds the sum to the row's ``window_reserved``. ``reserved_on`` is the
    note (``Hold.reserved_on_key`` or ``reserved_on_member``). Nothing is taken over
    for a budget removed (``amount`` None). Run before the row is locked: a settlement
    takes a hold's row before its key's and member's, so the holds' rows must be taken
    first here too, or the two could wait on each other.
    """
    if amount is None or not key_ids:
        return Decimal(0)
    taken = db.session.scalars(
        update(Hold)
        .where(Hold.api_key_id.in_(key_ids), Hold.status == OPEN, reserved_on.is_(false()))
        .values({reserved_on: True})
        .returning(Hold.amount)
        .execution_options(synchronize_session=False)
    ).all()
    return sum(taken, Decimal(0))


def apply_budget(
    row: BudgetCounters,
    amount: Decimal | None,
    window: str,
    key_ids: list[int],
    taken_over: Decimal = Decimal(0),
) -> None:
    """Set ``row``'s budget (its row locked); a new window counts what ``key_ids`` spent in it.

    ``taken_over`` is what the holds take_over_open_holds noted as reserved on the row
    sum to: it joins the row's ``window_reserved``, where their ends will release it.
    The holds of ``key_ids`` placed in the new calendar window are noted as counted in
    it (``key_window_start`` or ``member_window_start``, as ``row`` is a key or a
    member): the settled ones' charges are its spend so far, the open ones' will be when
    they settle. A settlement waiting meanwhile takes the hold's row before the key's,
    the opposite order: PostgreSQL ends such a deadlock, and whichever of the two it
    ended runs again (the settlement, or the budget's change: again_after_deadlock).
    """
    row.budget = amount
    if taken_over:
        row.window_reserved = type(row).window_reserved + taken_over
    if window == row.budget_window:
        return
    row.budget_window = window
    if window in ROLLING_MICROS:
        row.window_start, row.window_spent = None, Decimal(0)
        return
    start = calendar_start(window, utcnow())
    noted = Hold.key_window_start if isinstance(row, ApiKey) else Hold.member_window_start
    in_window = (Hold.api_key_id.in_(key_ids), Hold.created_at >= start)
    db.session.execute(update(Hold).where(*in_window).values({noted: unix_micros(start)}))
    spent = db.session.scalar(
        select(func.sum(-LedgerEntry.amount))
        .join(Hold, Hold.id == LedgerEntry.generation_id)
        .where(LedgerEntry.kind == CHARGE, Hold.status != OPEN, *in_window)
    )
    row.window_start, row.window_spent = unix_micros(start), spent or Decimal(0)


def checked_budget_amount(amount: Decimal | None, what: str = "the budget") -> Decimal | None:
    """Return ``amount`` if it is a valid USD amount; raise InvalidKeyLimits otherwise.

    ``what`` names the amount in the message: the budget, a key's monthly limit.
    """
    if amount is None:
        return None
    if isinstance(amount, bool) or not isinstance(amount, Decimal | int):
        raise InvalidKeyLimits(f"{what} must be an amount in USD")
    limit = Decimal(amount)
    if not limit.is_finite():
        raise InvalidKeyLimits(f"{what} must be an amount in USD")
    if limit < 0:
        raise InvalidKeyLimits(f"{what} must not be negative: {limit}")
    if limit > MAX_BUDGET:
        raise InvalidKeyLimits(f"{what} must be at most {MAX_BUDGET} USD")
    if limit != limit.quantize(LIMIT_QUANTUM):
        raise InvalidKeyLimits(
            f"{what} has more than {LIMIT_DECIMAL_PLACES} decimal places: {limit}"
        )
    return limit
