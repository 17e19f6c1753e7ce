"""What the dashboard reads of an account: its keys with their spend, balance and ledger."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from app.auth.models import DELETED, ApiKey
from app.credits.ledger import month_start
from app.credits.models import Account, LedgerEntry
from app.dashboard.pages import Page, fetch_page
from app.dashboard.usage import spend_by_key_since
from app.extensions import db


@dataclass(frozen=True)
class KeyRow:
    """A key as the keys page lists it."""

    key: ApiKey
    spend_this_month: Decimal


def find_account_key(account_id: int, key_id: int) -> ApiKey | None:
    """Return key ``key_id`` if the account owns it and it is not deleted, else None."""
    return db.session.scalar(
        select(ApiKey).where(
            ApiKey.id == key_id, ApiKey.account_id == account_id, ApiKey.state != DELETED
        )
    )


def account_keys(account_id: int) -> list[ApiKey]:
    """Return the account's keys (not deleted), newest first."""
    return list(
        db.session.scalars(
            select(ApiKey)
            .where(ApiKey.account_id == account_id, ApiKey.state != DELETED)
            .order_by(ApiKey.id.desc())
        )
    )


def account_key_rows(account_id: int, now: datetime) -> list[KeyRow]:
    """Return the account's keys (not deleted), newest first, with their spend this month."""
    keys = account_keys(account_id)
    spend = spend_by_key_since(account_id, month_start(now.astimezone(UTC)))
    return [KeyRow(key, spend.get(key.id, Decimal(0))) for key in keys]


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
