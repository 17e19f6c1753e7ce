"""What the dashboard reads of an account: its keys with their spend, balance and ledger."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from app.accounts.models import Membership, Person
from app.auth.models import DELETED, ApiKey
from app.budgets import MONTH, budget_state
from app.credits.balances import month_start
from app.credits.models import Account, LedgerEntry
from app.dashboard.pages import Page, fetch_page
from app.dashboard.usage import spend_by_key_since
from app.extensions import db


@dataclass(frozen=True)
class KeyRow:
    """A key as the keys page lists it: ``spent`` in ``spent_window`` (its limit's window).

    A key without a limit counts the calendar month.
    """

    key: ApiKey
    spent: Decimal
    spent_window: str
    member_email: str


def find_account_key(account_id: int, key_id: int) -> ApiKey | None:
    """Return key ``key_id`` if the account owns it and it is not deleted, else None."""
    return db.session.scalar(
        select(ApiKey).where(
            ApiKey.id == key_id, ApiKey.account_id == account_id, ApiKey.state != DELETED
        )
    )


def account_keys(account_id: int, member_id: int | None = None) -> list[ApiKey]:
    """Return the account's keys (not deleted), newest first; only a member's if named."""
    statement = select(ApiKey).where(ApiKey.account_id == account_id, ApiKey.state != DELETED)
    if member_id is not None:
        statement = statement.where(ApiKey.member_id == member_id)
    return list(db.session.scalars(statement.order_by(ApiKey.id.desc())))


def key_member(key: ApiKey) -> Membership:
    """Return the membership ``key`` belongs to (removed or not)."""
    return db.session.get(Membership, key.member_id)


def memberships(account_id: int) -> list[Membership]:
    """Return every membership of the organisation, removed ones too."""
    return list(db.session.scalars(select(Membership).where(Membership.account_id == account_id)))


def account_key_rows(account_id: int, now: datetime, member_id: int | None = None) -> list[KeyRow]:
    """Return the account's keys (not deleted), newest first, with their spend.

    A limited key's spend is its limit's window's, as the limit counts it; any other's
    is this calendar month's. Only the member's keys if ``member_id`` is given; each row
    names the key's member.
    """
    keys = account_keys(account_id, member_id)
    this_month = spend_by_key_since(account_id, month_start(now.astimezone(UTC)))
    owners = member_emails(account_id)
    rows = []
    for key in keys:
        if key.budget is None:
            spent, window = this_month.get(key.id, Decimal(0)), MONTH
        else:
            spent, window = budget_state(key, now).spent, key.budget_window
        rows.append(KeyRow(key, spent, window, owners.get(key.member_id, "")))
    return rows


def member_emails(account_id: int) -> dict[int, str]:
    """Return the email of each of the organisation's memberships, removed ones too, by id."""
    rows = db.session.execute(
        select(Membership.id, Person.email)
        .join(Person, Person.id == Membership.person_id)
        .where(Membership.account_id == account_id)
    )
    return dict(rows.all())


def ledger_page(account_id: int, number: int) -> Page[Any]:
    """Return page ``number`` of the account's grants and charges, newest first."""
    statement = (
        select(LedgerEntry)
        .where(LedgerEntry.account_id == account_id)
        .order_by(LedgerEntry.id.desc())
    )
    return fetch_page(statement, number)


def find_account(account_id: int) -> Account | None:
    """Return the account with ``account_id``, or None."""
    return db.session.get(Account, account_id)


def accounts_page(number: int) -> Page[Any]:
    """Return page ``number`` of every account, newest first (for operators)."""
    return fetch_page(select(Account).order_by(Account.id.desc()), number)
