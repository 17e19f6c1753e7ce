"""Invites: a one-time link, valid 24 hours, that makes a person a member with a role.

A person new to the gateway sets their password on the link's page; a person who already
has one signs in as usual and joins from the link's page. Either way the invite's
membership starts when the link is used, once.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update

from app.accounts.models import OWNER, AccountInvite, Membership, Person
from app.accounts.organisations import create_account, find_person_by_email, stage_person
from app.accounts.passwords import check_password_strength, stage_password
from app.credits.accounts import find_account
from app.credits.models import Account
from app.database import utcnow
from app.extensions import db

INVITE_LIFETIME = timedelta(hours=24)
_INVALID = "This invite link is not valid: it was used, or it expired."


class InviteInvalid(LookupError):
    """The invite token is unknown, used or expired."""


@dataclass(frozen=True)
class OpenInvite:
    """What an invite link's page shows: who it is for, where, and whether they sign in."""

    person: Person
    account: Account
    role: str

    @property
    def needs_password(self) -> bool:
        """Whether the person is new and sets a password, rather than signs in with theirs."""
        return self.person.password_hash is None


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def stage_invite(*, account_id: int, person: Person, role: str) -> str:
    """Add an invite of ``person`` to the organisation to the session; return its token."""
    token = secrets.token_urlsafe(32)
    db.session.add(
        AccountInvite(
            account_id=account_id,
            person_id=person.id,
            role=role,
            token_digest=_digest(token),
            expires_at=utcnow() + INVITE_LIFETIME,
        )
    )
    return token


def create_invite(email: str) -> str:
    """Return a new invite token for the holder of account ``email``, making it if needed."""
    account = find_account(email) or create_account(email=email)
    person = find_person_by_email(email) or stage_person(email)
    token = stage_invite(account_id=account.id, person=person, role=OWNER)
    db.session.commit()
    return token


def find_open_invite(token: str) -> OpenInvite:
    """Return the open invite of ``token``. :raise InviteInvalid: unknown, used, expired."""
    invite = db.session.scalar(
        select(AccountInvite).where(AccountInvite.token_digest == _digest(token))
    )
    if invite is None or invite.used_at is not None or invite.expires_at <= utcnow():
        raise InviteInvalid(_INVALID)
    return OpenInvite(
        person=db.session.get(Person, invite.person_id),
        account=db.session.get(Account, invite.account_id),
        role=invite.role,
    )


def accept_invite(token: str, password: str) -> Person:
    """Use up the invite of a person new to the gateway: set their password, join them.

    All in one transaction. A person who has a password joins by ``join_by_invite``,
    signed in: the link's page never checks a password, so whoever holds a link (the
    admin who was shown it) cannot guess at one there.
    :raise InviteInvalid: the token is unknown, used or expired (also when another
        request used it first), or the person has a password already.
    :raise WeakPassword: the password is too short or too long.
    """
    invite = find_open_invite(token)
    if not invite.needs_password:
        raise InviteInvalid(f"Sign in as {invite.person.email} to accept this invite.")
    check_password_strength(password)
    _use_up(token)
    stage_password(invite.person.id, password)
    _stage_membership(invite)
    db.session.commit()
    return invite.person


def join_by_invite(token: str, person_id: int) -> OpenInvite:
    """Use up the invite for the signed-in person ``person_id``, making them a member.

    :raise InviteInvalid: the token is unknown, used or expired, or is for someone else.
    """
    invite = find_open_invite(token)
    if invite.person.id != person_id:
        raise InviteInvalid(f"This invite is for {invite.person.email}: sign in as them.")
    _use_up(token)
    _stage_membership(invite)
    db.session.commit()
    return invite


def _use_up(token: str) -> None:
    """Mark the invite used; the conditional UPDATE makes two submissions join once."""
    used = db.session.execute(
        update(AccountInvite)
        .where(AccountInvite.token_digest == _digest(token), AccountInvite.used_at.is_(None))
        .values(used_at=utcnow())
    )
    if used.rowcount != 1:
        db.session.rollback()
        raise InviteInvalid(_INVALID)


def _stage_membership(invite: OpenInvite) -> None:
    """Make the person a member with the invite's role; a former member rejoins."""
    membership = db.session.scalar(
        select(Membership).where(
            Membership.account_id == invite.account.id,
            Membership.person_id == invite.person.id,
        )
    )
    if membership is None:
        db.session.add(
            Membership(account_id=invite.account.id, person_id=invite.person.id, role=invite.role)
        )
    elif membership.removed_at is not None:
        membership.role, membership.removed_at = invite.role, None
