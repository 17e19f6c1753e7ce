"""The signed-in person, as Flask-Login keeps them, and the organisation they work in.

The session cookie names the person (Flask-Login) and their current organisation
(``organisation_id``); a person who belongs to several switches between them. Every
request reloads the membership, so a role changed or a member removed takes effect on
their next page. The person is named with a mark of their password hash, so that
setting a new password ends every session opened with the old one.
"""

from __future__ import annotations

import hashlib

from flask import Flask, session
from flask_login import UserMixin, login_user

from app.accounts.models import Membership, Person
from app.accounts.organisations import active_membership, memberships_of, organisation_label
from app.credits.models import Account
from app.extensions import DashboardSessionInterface, db, login_manager

ORGANISATION = "organisation_id"


class DashboardUser(UserMixin):
    """The person a dashboard session belongs to, in their current organisation.

    ``account_id``, ``member_id``, ``role``, ``organisation_name`` and
    ``organisation_label`` (the name as pages show it) are None when the person belongs
    to no organisation (every membership removed).
    """

    def __init__(self, person: Person, membership: Membership | None) -> None:
        self.person_id = person.id
        self.password_mark = password_mark(person)
        self.email = person.email
        self.is_admin = person.is_admin
        self.account_id = membership.account_id if membership else None
        self.member_id = membership.id if membership else None
        self.role = membership.role if membership else None
        account = db.session.get(Account, membership.account_id) if membership else None
        self.organisation_name = account.name if account else None
        # A sign-up's organisation is named after this address (None for one made later).
        self.organisation_personal_of = account.email if account else None
        self.organisation_label = (
            organisation_label(account.name, account.email, person.email) if account else None
        )

    def get_id(self) -> str:
        """Return what the session cookie records: the person's id and password mark."""
        return f"{self.person_id}.{self.password_mark}"


def password_mark(person: Person) -> str:
    """Return a short digest of the person's password hash, which changes with the password.

    The hash is salted, so its digest tells nothing of the password; the cookie is signed,
    so it cannot be forged. Rehashing on new Argon2 parameters ends sessions too, once.
    """
    return hashlib.sha256((person.password_hash or "").encode()).hexdigest()[:16]


def current_membership(person_id: int) -> Membership | None:
    """Return the membership of the session's organisation, else the person's first one."""
    chosen = session.get(ORGANISATION)
    if isinstance(chosen, int):
        membership = active_membership(person_id, chosen)
        if membership is not None:
            return membership
    memberships = memberships_of(person_id)
    return memberships[0][0] if memberships else None


def load_user(user_id: str) -> DashboardUser | None:
    """Return the session's person, or None if they are gone or their password changed."""
    person_id, _, mark = user_id.partition(".")
    try:
        person = db.session.get(Person, int(person_id))
    except ValueError:
        return None
    if person is None or mark != password_mark(person):
        return None
    return DashboardUser(person, current_membership(person.id))


def start_session(person: Person) -> None:
    """Sign ``person`` in with a fresh session, so no earlier session state carries over."""
    session.clear()
    login_user(DashboardUser(person, current_membership(person.id)))


def switch_organisation(person_id: int, account_id: int) -> Account | None:
    """Make ``account_id`` the session's organisation; None if the person is no member."""
    if active_membership(person_id, account_id) is None:
        return None
    session[ORGANISATION] = account_id
    return db.session.get(Account, account_id)


def init_sessions(app: Flask) -> None:
    """Bind the dashboard's cookie sessions and Flask-Login (pages send strangers to sign in)."""
    app.session_interface = DashboardSessionInterface()
    login_manager.init_app(app)
    login_manager.user_loader(load_user)
    login_manager.login_view = "dashboard.sign_in"
    login_manager.login_message = "Sign in to see that page."
    login_manager.login_message_category = "info"
