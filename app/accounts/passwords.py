"""Dashboard passwords: Argon2id hashes, sign-up, sign-in and setting a password.

A wrong email and a wrong password are refused alike, and take alike long: an unknown
email is checked against a dummy hash, so neither the answer nor its timing tells
whether an account exists.
"""

from __future__ import annotations

from decimal import Decimal

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.accounts.models import AccountPassword
from app.credits.accounts import AccountExists
from app.credits.models import Account
from app.database import utcnow
from app.extensions import db

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 256
_hasher = PasswordHasher()  # Argon2id, with the library's recommended parameters
_DUMMY_HASH = _hasher.hash("an unknown account is checked against this")


class WeakPassword(ValueError):
    """The password is too short or too long."""


def normalize_email(email: str) -> str:
    """Return ``email`` as accounts made from the dashboard store it: trimmed, lower case."""
    return email.strip().lower()


def check_password_strength(password: str) -> None:
    """Raise WeakPassword unless ``password`` has 12 to 256 characters."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPassword(f"Use at least {MIN_PASSWORD_LENGTH} characters.")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise WeakPassword(f"Use at most {MAX_PASSWORD_LENGTH} characters.")


def find_account_by_email(email: str) -> Account | None:
    """Return the account whose email matches ``email`` in any letter case, or None."""
    return db.session.scalar(
        select(Account).where(func.lower(Account.email) == normalize_email(email))
    )


def register_account(*, email: str, password: str) -> Account:
    """Create an account that signs in with ``password``, in one transaction.

    :raise WeakPassword: the password is too short or too long.
    :raise AccountExists: an account has this email, in any letter case.
    """
    check_password_strength(password)
    email = normalize_email(email)
    if find_account_by_email(email) is not None:
        raise AccountExists("An account with this email already exists.")
    account = Account(email=email, is_admin=False, balance=Decimal(0), reserved=Decimal(0))
    db.session.add(account)
    try:
        db.session.flush()
        db.session.add(AccountPassword(account_id=account.id, password_hash=_hasher.hash(password)))
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise AccountExists("An account with this email already exists.") from None
    return account


def set_password(account_id: int, password: str) -> None:
    """Give the account ``password`` (replacing any). :raise WeakPassword: too short or long."""
    check_password_strength(password)
    stage_password(account_id, password)
    db.session.commit()


def stage_password(account_id: int, password: str) -> None:
    """Add or replace the account's password hash in the session, for the caller to commit."""
    hashed = _hasher.hash(password)
    record = db.session.get(AccountPassword, account_id)
    if record is None:
        db.session.add(AccountPassword(account_id=account_id, password_hash=hashed))
    else:
        record.password_hash, record.updated_at = hashed, utcnow()


def authenticate(email: str, password: str) -> Account | None:
    """Return the account if ``password`` is its password, else None (whatever was wrong)."""
    account = find_account_by_email(email)
    record = db.session.get(AccountPassword, account.id) if account else None
    stored = record.password_hash if record else _DUMMY_HASH
    try:
        _hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return None
    if record is None:
        return None
    if _hasher.check_needs_rehash(stored):
        stage_password(record.account_id, password)
    db.session.commit()
    return account
