"""Dashboard passwords: Argon2id hashes, sign-up, sign-in and setting a password.

A person signs in once, whatever organisations they belong to. A wrong email and a wrong
password are refused alike, and take alike long: an unknown email is checked against a
dummy hash, so neither the answer nor its timing tells whether a person exists.
"""

from __future__ import annotations

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy.exc import IntegrityError

from app.accounts.models import Person
from app.accounts.organisations import find_person_by_email, normalize_email, stage_account
from app.credits.accounts import AccountExists
from app.extensions import db

MIN_PASSWORD_LENGTH = 12
MAX_PASSWORD_LENGTH = 256
_hasher = PasswordHasher()  # Argon2id, with the library's recommended parameters
_DUMMY_HASH = _hasher.hash("an unknown account is checked against this")

__all__ = ["normalize_email"]  # re-exported: the dashboard counts sign-ins by it


class WeakPassword(ValueError):
    """The password is too short or too long."""


def check_password_strength(password: str) -> None:
    """Raise WeakPassword unless ``password`` has 12 to 256 characters."""
    if len(password) < MIN_PASSWORD_LENGTH:
        raise WeakPassword(f"Use at least {MIN_PASSWORD_LENGTH} characters.")
    if len(password) > MAX_PASSWORD_LENGTH:
        raise WeakPassword(f"Use at most {MAX_PASSWORD_LENGTH} characters.")


def hash_password(password: str) -> str:
    """Return the Argon2id hash of ``password``, as a person's password is kept."""
    return _hasher.hash(password)


def register_account(*, email: str, password: str) -> Person:
    """Create a person who signs in with ``password`` and owns a new organisation.

    Never touches a person who exists, with a password or not: their password is set
    only by a link of their own (app.accounts.links).
    :raise WeakPassword: the password is too short or too long.
    :raise AccountExists: a person has this email, in any letter case.
    """
    check_password_strength(password)
    return register_hashed(email=email, password_hash=hash_password(password))


def register_hashed(*, email: str, password_hash: str) -> Person:
    """Create a person with the hash of the password they chose, owning a new organisation.

    :raise AccountExists: a person has this email, in any letter case.
    """
    email = normalize_email(email)
    if find_person_by_email(email) is not None:
        raise AccountExists("An account with this email already exists.")
    person = Person(email=email, is_admin=False, password_hash=password_hash)
    db.session.add(person)
    try:
        db.session.flush()
        stage_account(email=email, name=email, owner=person)
        db.session.commit()
    except IntegrityError:
        db.session.rollback()
        raise AccountExists("An account with this email already exists.") from None
    return person


def set_password(person_id: int, password: str) -> None:
    """Give the person ``password`` (replacing any). :raise WeakPassword: too short or long."""
    check_password_strength(password)
    stage_password(person_id, password)
    db.session.commit()


def stage_password(person_id: int, password: str) -> None:
    """Set the person's password hash in the session, for the caller to commit."""
    db.session.get(Person, person_id).password_hash = hash_password(password)


def password_matches(person: Person, password: str) -> bool:
    """Return whether ``password`` is the person's, rehashing it if the hash is outdated."""
    stored = person.password_hash or _DUMMY_HASH
    try:
        _hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False
    if person.password_hash is None:
        return False
    if _hasher.check_needs_rehash(stored):
        stage_password(person.id, password)
    return True


def authenticate(email: str, password: str) -> Person | None:
    """Return the person if ``password`` is their password, else None (whatever was wrong)."""
    person = find_person_by_email(email)
    if person is None:
        _check_dummy(password)
        return None
    matches = password_matches(person, password)
    db.session.commit()
    return person if matches else None


def _check_dummy(password: str) -> None:
    # An unknown email takes as long as a known one.
    try:
        _hasher.verify(_DUMMY_HASH, password)
    except (VerificationError, InvalidHashError):
        pass
