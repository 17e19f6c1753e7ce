"""Organisations and their people: making one, its owner, who belongs where.

An organisation is an ``accounts`` row; the person who makes it is its owner. A person is
found by their email in any letter case, and is made once whatever organisations they
join.
"""

from __future__ import annotations

import re
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.accounts.models import OWNER, Membership, Person
from app.credits.accounts import AccountExists
from app.credits.models import Account
from app.extensions import db

# One address as people type it: a local part, one @, a domain with a dot; no blanks or
# list separators. Deliverability is the mail server's to judge.
EMAIL_ADDRESS = re.compile(r"[^@\s,;<>]+@[^@\s,;<>.]+(\.[^@\s,;<>.]+)+")


def is_email_address(text: str) -> bool:
    """Return whether ``text`` (trimmed) reads as one e-mail address."""
    text = text.strip()
    return len(text) <= 320 and EMAIL_ADDRESS.fullmatch(text) is not None


def normalize_email(email: str) -> str:
    """Return ``email`` as people are stored: trimmed, lower case."""
    return email.strip().lower()


def find_person_by_email(email: str) -> Person | None:
    """Return the person whose email matches ``email`` in any letter case, or None."""
    return db.session.scalar(
        select(Person).where(func.lower(Person.email) == normalize_email(email))
    )


def stage_person(email: str, *, is_admin: bool = False) -> Person:
    """Return the person with ``email``, adding one to the session if there is none."""
    person = find_person_by_email(email)
    if person is None:
        person = Person(email=normalize_email(email), is_admin=is_admin)
        db.session.add(person)
        db.session.flush()
    elif is_admin:
        person.is_admin = True
    return person


def stage_account(*, email: str | None, name: str, owner: Person) -> Account:
    """Add an empty organisation owned by ``owner`` to the session, for the caller to commit."""
    account = Account(email=email, name=name, balance=Decimal(0), reserved=Decimal(0))
    db.session.add(account)
    db.session.flush()
    db.session.add(Membership(account_id=account.id, person_id=owner.id, role=OWNER))
    db.session.flush()
    return account


def create_account(*, email: str, is_admin: bool = False, name: str | None = None) -> Account:
    """Create an empty organisation whose holder, the person ``email``, is its owner.

    The organisation is found by ``email`` later (``app.credits.accounts.find_account``).
    :raise AccountExists: an organisation already has this email.
    """
    try:
        owner = stage_person(email, is_admin=is_admin)
        account = stage_account(email=email, name=name or email, owner=owner)
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise AccountExists(f"an account with email {email!r} already exists") from None
    return account


def owner_membership(account_id: int) -> Membership | None:
    """Return the organisation's first owner who is still a member, or None."""
    return db.session.scalar(
        select(Membership)
        .where(
            Membership.account_id == account_id,
            Membership.role == OWNER,
            Membership.removed_at.is_(None),
        )
        .order_by(Membership.id)
        .limit(1)
    )


def active_membership(person_id: int, account_id: int) -> Membership | None:
    """Return the person's membership of the organisation, None unless they are a member."""
    return db.session.scalar(
        select(Membership).where(
            Membership.person_id == person_id,
            Membership.account_id == account_id,
            Membership.removed_at.is_(None),
        )
    )


def memberships_of(person_id: int) -> list[tuple[Membership, Account]]:
    """Return the person's memberships with their organisations, oldest membership first."""
    rows = db.session.execute(
        select(Membership, Account)
        .join(Account, Account.id == Membership.account_id)
        .where(Membership.person_id == person_id, Membership.removed_at.is_(None))
        .order_by(Membership.id)
    )
    return [(membership, account) for membership, account in rows]


def organisation_label(name: str, personal_of: str | None, viewer_email: str | None) -> str:
    """Name an organisation so it is not read as a person.

    A sign-up's organisation is named after its holder's address (``personal_of``):
    it reads "your personal organisation" to its holder, "alice@example.com's
    organisation" to others.
    """
    if personal_of is None or name != personal_of:
        return name
    if viewer_email is not None and viewer_email.lower() == personal_of.lower():
        return "your personal organisation"
    return f"{personal_of}'s organisation"
