"""Accounts: creating them and finding them by email."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

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


def create_account(*, email: str, is_admin: bool = False) -> Account:
    """Create an empty account; raise AccountExists if the email is taken."""
    account = Account(email=email, is_admin=is_admin, balance=Decimal(0), reserved=Decimal(0))
    db.session.add(account)
    try:
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise AccountExists(f"an account with email {email!r} already exists") from None
    return account
