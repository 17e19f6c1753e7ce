"""Invites: a one-time link, valid 24 hours, that makes the holder of an address a member.

An invite is bound to the address it was sent to: the person who signs in with that
address accepts it, and it never sets or resets a password. One exception, since the
operator issued it: an invite of the operator's (``flask orgs invite``, no inviter) lets
a person who has no password yet, or no account, set one on the link's page.

An invite is open while it is unused, unexpired and unrevoked, and while its inviter is
still a member of the organisation with the role that allowed it (admin, owner for an
owner's invite): checked when it is used, so it dies with its inviter's role.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update

from app.accounts.links import new_token, token_digest
from app.accounts.models import (
    ADMIN,
    OWNER,
    AccountInvite,
    Membership,
    Person,
    has_role,
)
from app.accounts.organisations import (
    active_membership,
    find_person_by_email,
    normalize_email,
    stage_person,
)
from app.accounts.passwords import check_password_strength, stage_password
from app.credits.models import Account
from app.database import utcnow
from app.extensions import db
from app.mail import send_mail

INVITE_LIFETIME = timedelta(hours=24)
_INVALID = "This invite link is not valid: it was used, revoked, or it expired."


class InviteInvalid(LookupError):
    """The invite token is unknown, used, revoked or expired, or its inviter lost the right."""


class InviteNotYours(PermissionError):
    """The invite is for another address than the signed-in person's."""


@dataclass(frozen=True)
class OpenInvite:
    """What an invite link's page shows: the address it is for, where, and with what role."""

    id: int
    email: str
    account: Account
    role: str
    from_operator: bool
    person: Person | None

    @property
    def needs_password(self) -> bool:
        """Whether the link's page sets a password: the operator's invite of someone without."""
        return self.from_operator and (self.person is None or self.person.password_hash is None)


@dataclass(frozen=True)
class PendingInvite:
    """An open invite as the members page lists it."""

    invite: AccountInvite
    inviter_email: str | None


def stage_invite(
    *, account_id: int, email: str, role: str, inviter_id: int | None
) -> tuple[AccountInvite, str]:
    """Add an invite of ``email`` to the session; return it and its token."""
    token, digest = new_token()
    invite = AccountInvite(
        account_id=account_id,
        email=normalize_email(email),
        role=role,
        inviter_id=inviter_id,
        token_digest=digest,
        expires_at=utcnow() + INVITE_LIFETIME,
    )
    db.session.add(invite)
    db.session.flush()
    return invite, token


def role_to_invite(role: str) -> str:
    """Return the least role that may invite with ``role``: an owner's invite takes an owner."""
    return OWNER if role == OWNER else ADMIN


def is_open(invite: AccountInvite) -> bool:
    """Return whether ``invite`` may still be used, its inviter's role checked now."""
    if invite.used_at is not None or invite.revoked_at is not None:
        return False
    if invite.expires_at <= utcnow():
        return False
    if invite.inviter_id is None:
        return True
    inviter = active_membership(invite.inviter_id, invite.account_id)
    return inviter is not None and has_role(inviter.role, role_to_invite(invite.role))


def find_open_invite(token: str) -> OpenInvite:
    """Return the open invite of ``token``. :raise InviteInvalid: it is not open."""
    invite = db.session.scalar(
        select(AccountInvite).where(AccountInvite.token_digest == token_digest(token))
    )
    if invite is None or not is_open(invite):
        raise InviteInvalid(_INVALID)
    return OpenInvite(
        id=invite.id,
        email=invite.email,
        account=db.session.get(Account, invite.account_id),
        role=invite.role,
        from_operator=invite.inviter_id is None,
        person=find_person_by_email(invite.email),
    )


def accept_invite(token: str, password: str) -> Person:
    """Use up an operator's invite of someone without a password: set it, join them.

    All in one transaction. Anyone else joins by ``join_by_invite``, signed in.
    :raise InviteInvalid: the invite is not open (also when another request used it
        first), or is not the operator's, or the person has a password already.
    :raise WeakPassword: the password is too short or too long.
    """
    invite = find_open_invite(token)
    if not invite.needs_password:
        raise InviteInvalid(f"Sign in as {invite.email} to accept this invite.")
    check_password_strength(password)
    _use_up(invite.id)
    person = stage_person(invite.email)
    stage_password(person.id, password)
    _stage_membership(invite, person.id)
    db.session.commit()
    return person


def join_by_invite(token: str, person_id: int) -> OpenInvite:
    """Use up the invite for the signed-in person ``person_id``, making them a member.

    :raise InviteInvalid: the invite is not open.
    :raise InviteNotYours: the person's address is not the one the invite was sent to.
    """
    invite = find_open_invite(token)
    person = db.session.get(Person, person_id)
    if normalize_email(person.email) != invite.email:
        raise InviteNotYours(
            f"This invite is for {invite.email}; you are signed in as {person.email}."
        )
    _use_up(invite.id)
    _stage_membership(invite, person.id)
    db.session.commit()
    return invite


def pending_invites(account_id: int) -> list[PendingInvite]:
    """Return the organisation's open invites, newest first, with their inviter's email."""
    rows = db.session.execute(
        select(AccountInvite, Person.email)
        .outerjoin(Person, Person.id == AccountInvite.inviter_id)
        .where(
            AccountInvite.account_id == account_id,
            AccountInvite.used_at.is_(None),
            AccountInvite.revoked_at.is_(None),
            AccountInvite.expires_at > utcnow(),
        )
        .order_by(AccountInvite.id.desc())
    )
    return [PendingInvite(invite, email) for invite, email in rows if is_open(invite)]


def _use_up(invite_id: int) -> None:
    """Mark the invite used; the conditional UPDATE makes two submissions join once."""
    used = db.session.execute(
        update(AccountInvite)
        .where(
            AccountInvite.id == invite_id,
            AccountInvite.used_at.is_(None),
            AccountInvite.revoked_at.is_(None),
        )
        .values(used_at=utcnow())
    )
    if used.rowcount != 1:
        db.session.rollback()
        raise InviteInvalid(_INVALID)


def _stage_membership(invite: OpenInvite, person_id: int) -> None:
    """Make the person a member with the invite's role; a former member rejoins."""
    membership = db.session.scalar(
        select(Membership).where(
            Membership.account_id == invite.account.id, Membership.person_id == person_id
        )
    )
    if membership is None:
        db.session.add(
            Membership(account_id=invite.account.id, person_id=person_id, role=invite.role)
        )
    elif membership.removed_at is not None:
        membership.role, membership.removed_at = invite.role, None


def mail_invite(*, email: str, organisation: str, inviter: str, link: str) -> None:
    """Mail the invite's ``link`` to ``email``, from ``inviter`` (who the holder knows).

    The dashboard and ``flask orgs invite`` send the same message.
    :raise MailNotConfigured: SMTP_URL is unset. :raise smtplib.SMTPException, OSError:
        the server refused or could not be reached.
    """
    body = (
        f"{inviter} invites you to {organisation}.\n\n"
        f"Open this link within 24 hours, and sign in (or sign up) as {email} to join; "
        f"it works once:\n{link}\n"
    )
    send_mail(email, f"Join {organisation}", body)
