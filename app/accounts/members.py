"""Who may do what in an organisation, and the changes to its members.

Roles rank owner > admin > member. An admin manages members and keys, but only an owner
makes or unmakes an owner; an organisation always keeps one owner. Removing a member
revokes their keys in the same transaction (their history stays theirs). Every change is
recorded in the audit log (``app.accounts.changes``) in the transaction that makes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from app.accounts.changes import record_change
from app.accounts.errors import (
    AlreadyMember,
    LastOwner,
    MemberNotFound,
    NotAllowed,
    OrganisationNameRefused,
)
from app.accounts.invites import is_open, role_to_invite, stage_invite
from app.accounts.keys import stage_revoke_member_keys
from app.accounts.models import (
    ADMIN,
    OWNER,
    RANK,
    ROLES,
    AccountInvite,
    Membership,
    Person,
    has_role,
)
from app.accounts.organisations import (
    active_membership,
    find_person_by_email,
    is_email_address,
    stage_account,
    stage_person,
)
from app.auth.keys import forget_remembered_callers
from app.credits.accounts import AccountNotFound
from app.credits.models import Account
from app.database import utcnow
from app.extensions import db


@dataclass(frozen=True)
class Actor:
    """Who makes a change: a member (their person, membership and role), or the operator."""

    person_id: int | None
    member_id: int | None
    role: str


# The operator's commands act with an owner's rights, as nobody in particular.
OPERATOR = Actor(person_id=None, member_id=None, role=OWNER)


@dataclass(frozen=True)
class MemberRow:
    """A member as the members page and ``flask orgs members`` list them."""

    membership: Membership
    email: str


def require_role(actor: Actor, needed: str) -> None:
    """Raise NotAllowed unless the actor's role is at least ``needed``."""
    if not has_role(actor.role, needed):
        raise NotAllowed(f"Only an organisation's {needed}s and above may do this.")


def may_manage_keys_of(actor: Actor, member: Membership) -> bool:
    """Whether the actor may create, change or end ``member``'s keys.

    Their own, always; another member's takes an admin, an owner's an owner: as with
    roles, an admin cannot act on an owner.
    """
    if member.id == actor.member_id:
        return True
    return has_role(actor.role, OWNER if member.role == OWNER else ADMIN)


def may_set_budget_of(actor: Actor, member: Membership) -> bool:
    """Whether the actor may set ``member``'s budget.

    An admin sets the budgets of members and other admins; an owner's budget, and an
    admin's own (which they could otherwise lift), are an owner's to set.
    """
    touches_owner_or_self = member.role == OWNER or member.id == actor.member_id
    return has_role(actor.role, OWNER if touches_owner_or_self else ADMIN)


def _checked_role(role: str) -> str:
    if role not in ROLES:
        raise MemberNotFound(f"no role {role!r}: use one of {', '.join(ROLES)}")
    return role


def find_member(account_id: int, member_id: int) -> Membership:
    """Return the organisation's current member ``member_id``. :raise MemberNotFound."""
    member = db.session.get(Membership, member_id)
    if member is None or member.account_id != account_id or member.removed_at is not None:
        raise MemberNotFound(f"no member {member_id} in this organisation")
    return member


def find_member_by_email(account_id: int, email: str) -> Membership:
    """Return the organisation's current member with ``email``. :raise MemberNotFound."""
    member = db.session.scalar(
        select(Membership)
        .join(Person, Person.id == Membership.person_id)
        .where(
            Membership.account_id == account_id,
            Membership.removed_at.is_(None),
            func.lower(Person.email) == email.strip().lower(),
        )
    )
    if member is None:
        raise MemberNotFound(f"{email} is no member of this organisation")
    return member


def list_members(account_id: int) -> list[MemberRow]:
    """Return the organisation's current members, owners first, then by when they joined."""
    rows = db.session.execute(
        select(Membership, Person.email)
        .join(Person, Person.id == Membership.person_id)
        .where(Membership.account_id == account_id, Membership.removed_at.is_(None))
        .order_by(Membership.id)
    )
    members = [MemberRow(membership, email) for membership, email in rows]
    return sorted(members, key=lambda row: -RANK[row.membership.role])


def invite_member(account_id: int, actor: Actor, *, email: str, role: str) -> str:
    """Invite ``email`` into the organisation with ``role``; return the link's token.

    The invite is bound to the address and records the actor as its inviter; nobody is
    made for an address the gateway does not know.
    :raise NotAllowed: the actor is no admin, or invites an owner without being one.
    :raise AlreadyMember: the person is a member already.
    """
    require_role(actor, role_to_invite(_checked_role(role)))
    person = find_person_by_email(email)
    if person is not None and active_membership(person.id, account_id) is not None:
        raise AlreadyMember(f"{email} is a member of this organisation already")
    invite, token = stage_invite(
        account_id=account_id, email=email, role=role, inviter_id=actor.person_id
    )
    record_change(
        actor.person_id, account_id, "member.invite", f"invite:{invite.id}",
        {"email": invite.email, "role": role},
    )  # fmt: skip
    db.session.commit()
    return token


def revoke_invite(account_id: int, actor: Actor, invite_id: int) -> AccountInvite:
    """Revoke the organisation's open invite ``invite_id``: its link stops working.

    :raise NotAllowed: the actor is no admin. :raise MemberNotFound: no such open invite.
    """
    require_role(actor, ADMIN)
    invite = db.session.get(AccountInvite, invite_id)
    if invite is None or invite.account_id != account_id or not is_open(invite):
        raise MemberNotFound(f"no open invite {invite_id} in this organisation")
    invite.revoked_at = utcnow()
    record_change(
        actor.person_id, account_id, "member.invite.revoke", f"invite:{invite.id}",
        {"email": invite.email, "role": invite.role},
    )  # fmt: skip
    db.session.commit()
    return invite


def change_role(account_id: int, actor: Actor, member_id: int, role: str) -> Membership:
    """Give member ``member_id`` the role ``role``.

    :raise NotAllowed: the actor is no admin, or makes or unmakes an owner without being
        one. :raise LastOwner: the organisation's last owner would lose the role.
    """
    member = find_member(account_id, member_id)
    touches_owner = OWNER in (_checked_role(role), member.role)
    require_role(actor, OWNER if touches_owner else ADMIN)
    if member.role == OWNER and role != OWNER:
        _keep_an_owner(account_id, member)
    before, member.role = member.role, role
    record_change(
        actor.person_id, account_id, "member.role", f"member:{member.id}",
        {"email": _email(member), "from": before, "to": role},
    )  # fmt: skip
    db.session.commit()
    return member


def remove_member(account_id: int, actor: Actor, member_id: int) -> int:
    """Remove member ``member_id`` and revoke their keys at once; return how many.

    A member may leave; removing another takes an admin, removing an owner an owner.
    :raise NotAllowed: the role is too low. :raise LastOwner: they are the last owner.
    """
    member = find_member(account_id, member_id)
    if actor.member_id != member.id:
        require_role(actor, OWNER if member.role == OWNER else ADMIN)
    if member.role == OWNER:
        _keep_an_owner(account_id, member)
    revoked = stage_revoke_member_keys(member.id)
    member.removed_at = utcnow()
    record_change(
        actor.person_id, account_id, "member.remove", f"member:{member.id}",
        {"email": _email(member), "role": member.role, "keys_revoked": revoked},
    )  # fmt: skip
    db.session.commit()
    forget_remembered_callers()
    return revoked


def _keep_an_owner(account_id: int, leaving: Membership) -> None:
    """Raise LastOwner unless another current owner remains, locking the owners' rows."""
    # Locked, so two owners demoting each other at once cannot both succeed.
    owners = db.session.scalars(
        select(Membership.id)
        .where(
            Membership.account_id == account_id,
            Membership.role == OWNER,
            Membership.removed_at.is_(None),
        )
        .with_for_update()
    ).all()
    if [owner for owner in owners if owner != leaving.id] == []:
        db.session.rollback()
        raise LastOwner("An organisation keeps at least one owner: make another owner first.")


def _email(member: Membership) -> str:
    return db.session.get(Person, member.person_id).email


def create_organisation(*, name: str, owner_email: str, actor: int | None) -> Account:
    """Create an empty organisation named ``name`` owned by the person ``owner_email``.

    The person is made if new (they set a password from an invite).
    :raise OrganisationNameRefused: the name is blank, or taken in any letter case (the
        operator's commands and the dashboard find an organisation by its name).
    """
    check_organisation_name(name)
    owner = stage_person(owner_email)
    account = stage_account(email=None, name=name.strip(), owner=owner)
    record_change(
        actor, account.id, "organisation.create", f"organisation:{account.id}",
        {"name": account.name, "owner": owner.email},
    )  # fmt: skip
    db.session.commit()
    return account


def check_organisation_name(name: str) -> None:
    """Refuse a blank name, an e-mail address, or one an organisation has in any letter case.

    An address names the personal organisation its holder's sign-up makes: taken by
    another first, it would make that sign-up's organisation a second of the name.
    :raise OrganisationNameRefused: saying which, and naming the organisation with the name.
    """
    if not name.strip():
        raise OrganisationNameRefused("an organisation's name must not be blank")
    if is_email_address(name):
        raise OrganisationNameRefused(
            "an organisation's name must not be an e-mail address: those name the holders' own"
        )
    if taken := organisations_named(name):
        raise OrganisationNameRefused(
            f"an organisation named {taken[0].name!r} exists already (id {taken[0].id})",
            taken[0].id,
        )


def organisations_named(name: str) -> list[Account]:
    """Return the organisations named ``name`` (trimmed) in any letter case, oldest first."""
    return list(
        db.session.scalars(
            select(Account)
            .where(func.lower(Account.name) == name.strip().lower())
            .order_by(Account.id)
        )
    )


def find_organisation(reference: str) -> Account:
    """Return the organisation with id or name ``reference``. :raise AccountNotFound."""
    numeric = reference.isascii() and reference.isdigit()
    if numeric and (account := db.session.get(Account, int(reference))):
        return account
    named = db.session.scalars(select(Account).where(Account.name == reference).limit(2)).all()
    if len(named) > 1:
        raise AccountNotFound(f"several organisations are named {reference!r}: use the id")
    if not named:
        raise AccountNotFound(f"no organisation with id or name {reference!r}")
    return named[0]
