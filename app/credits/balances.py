"""The money read back: what an account, a key and a member have, and what a hold got.

An account's money is its balance and what its open holds reserve of it; a key's or a
member's, its budget and what its current window spent and reserves. A hold placed is a
HeldCredit; one refused says why (Shortfall: the balance; BudgetShortfall: the key's or
the member's budget). Each read of a row has a locked twin (app.credits.sql.balances),
for a settlement that charges beyond its hold. Beside them: a hold's status, an
account's summary (granted, used, balance), and the open holds for the operator's
metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import bindparam, func, literal_column, select
from sqlalchemy.engine import Connection

from app.auth.models import ACTIVE
from app.budgets import MONTH, calendar_start, window_parameters
from app.credits.models import OPEN, Account, Hold, LedgerEntry
from app.credits.sql import balances as balance_sql
from app.database import utcnow
from app.extensions import db


@dataclass(frozen=True)
class HeldCredit:
    """An open hold: credit set aside for one request (and on ``key_id``'s allowance)."""

    id: str
    account_id: int
    amount: Decimal
    key_id: int | None = None


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


_HOLD_STATUS = select(Hold.status).where(Hold.id == bindparam("hold_id"))


def hold_status(hold_id: str, *, connection: Connection | None = None) -> str | None:
    """Return the status of the hold ``hold_id``; None if there is no such hold."""
    row = _read_one(_HOLD_STATUS, _HOLD_STATUS, connection, hold_id=hold_id)
    return row.status if row is not None else None


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


@dataclass(frozen=True)
class OpenHolds:
    """How many holds are open across all accounts, and the USD they hold."""

    count: int
    amount: Decimal


def open_holds_summary() -> OpenHolds:
    """Count the open holds and sum what they hold."""
    count, amount = db.session.execute(
        select(func.count(), func.sum(Hold.amount)).where(Hold.status == OPEN)
    ).one()
    db.session.commit()
    return OpenHolds(count=count, amount=amount or Decimal(0))


def month_start(moment: datetime) -> datetime:
    """Return the first instant of the calendar month (UTC) that ``moment`` falls in."""
    return calendar_start(MONTH, moment)
