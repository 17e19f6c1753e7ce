"""Operators' invites: a one-time link, valid 24 hours, where a holder sets a password."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import select, update

from app.accounts.models import AccountInvite
from app.accounts.passwords import (
    check_password_strength,
    find_account_by_email,
    normalize_email,
    stage_password,
)
from app.credits.accounts import create_account
from app.credits.models import Account
from app.database import utcnow
from app.extensions import db

INVITE_LIFETIME = timedelta(hours=24)


class InviteInvalid(LookupError):
    """The invite token is unknown, used or expired."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_invite(email: str) -> str:
    """Return a new invite token for ``email``, creating the account if there is none."""
    account = find_account_by_email(email) or create_account(email=normalize_email(email))
    token = secrets.token_urlsafe(32)
    db.session.add(
        AccountInvite(
            account_id=account.id,
            token_digest=_digest(token),
            expires_at=utcnow() + INVITE_LIFETIME,
        )
    )
    db.session.commit()
    return token


def find_invited_account(token: str) -> Account:
    """Return the account an open invite is for. :raise InviteInvalid: unknown, used, expired."""
    invite = db.session.scalar(
        select(AccountInvite).where(AccountInvite.token_digest == _digest(token))
    )
    if invite is None or invite.used_at is not None or invite.expires_at <= utcnow():
        raise InviteInvalid("This invite link is not valid: it was used, or it expired.")
    return db.session.get(Account, invite.account_id)


def accept_invite(token: str, password: str) -> Account:
    """Set the invited account's password and use up the invite, in one transaction.

    :raise InviteInvalid: the token is unknown, used or expired (also when another
        request used it first). :raise WeakPassword: the password is too short or long.
    """
    check_password_strength(password)
    account = find_invited_account(token)
    # The conditional UPDATE makes two submissions of one link set one password.
    used = db.session.execute(
        update(AccountInvite)
        .where(AccountInvite.token_digest == _digest(token), AccountInvite.used_at.is_(None))
        .values(used_at=utcnow())
    )
    if used.rowcount != 1:
        db.session.rollback()
        raise InviteInvalid("This invite link is not valid: it was used, or it expired.")
    stage_password(account.id, password)
    db.session.commit()
    return account
