"""Accounts: finding them by email (app.accounts.organisations makes them)."""

from __future__ import annotations

from sqlalchemy import select

from app.credits.models import Account
from app.extensions import db


class AccountNotFound(LookupError):
    """No account has the given email."""


class AccountExists(ValueError):
    """An account with the given email already exists."""


def find_account(email: str) -> Account | None:
    """Return the account with ``email``, or None."""
    return db.session.scalar(select(Account).where(Account.email == email))


def find_account_or_raise(email: str) -> Account:
    """Return the account with ``email``; raise AccountNotFound."""
    account = find_account(email)
    if account is None:
        raise AccountNotFound(f"no account with email {email!r}")
    return account
