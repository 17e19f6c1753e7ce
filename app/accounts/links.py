"""One-time links that set a password or confirm a sign-up: the only ways but sign-up itself.

A password link is issued by the operator (``flask accounts invite``, ``flask accounts
password-link``) or mailed to the address that asked for it; whoever holds it sets the
person's password, once. A pending sign-up keeps the hash of the password chosen until
the link mailed to its address is opened. Only each token's sha256 is stored: a token has
256 random bits, so a leaked table gives nothing to guess from.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import delete, select, update

from app.accounts.models import PasswordLink, PendingSignUp, Person
from app.accounts.organisations import create_account, find_person_by_email, normalize_email
from app.accounts.passwords import (
    check_password_strength,
    hash_password,
    register_hashed,
    stage_password,
)
from app.credits.accounts import AccountExists, AccountNotFound, find_account
from app.database import utcnow, write_transaction
from app.extensions import db

OPERATOR_LINK_LIFETIME = timedelta(hours=24)
MAILED_LINK_LIFETIME = timedelta(hours=1)
SIGN_UP_LIFETIME = timedelta(hours=24)
INVITE, RESET = "invite", "reset"
_INVALID = "This link is not valid: it was used, or it expired."


class LinkInvalid(LookupError):
    """The link's token is unknown, used or expired."""


def new_token() -> tuple[str, str]:
    """Return a new token for a link, and the digest that is stored of it."""
    token = secrets.token_urlsafe(32)
    return token, token_digest(token)


def token_digest(token: str) -> str:
    """Return what is stored of ``token``: its sha256, in hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def issue_password_link(email: str, *, purpose: str = RESET, lifetime: timedelta) -> str:
    """Return a one-time link's token where the person ``email`` sets a password.

    :raise AccountNotFound: no person has this address.
    """
    person = find_person_by_email(email)
    if person is None:
        raise AccountNotFound(f"no person with email {normalize_email(email)!r}")
    token, digest = new_token()
    db.session.add(
        PasswordLink(
            person_id=person.id,
            token_digest=digest,
            purpose=purpose,
            expires_at=utcnow() + lifetime,
        )
    )
    db.session.commit()
    return token


def invite_account_holder(email: str) -> str:
    """Make the account of ``email`` if there is none; return a 24-hour password link's token."""
    if find_account(email) is None:
        create_account(email=email)
    return issue_password_link(email, purpose=INVITE, lifetime=OPERATOR_LINK_LIFETIME)


def request_password_reset(email: str) -> str | None:
    """Return an hour's password link for the person ``email``, None if there is none."""
    try:
        return issue_password_link(email, lifetime=MAILED_LINK_LIFETIME)
    except AccountNotFound:
        return None


def find_link_person(token: str) -> Person:
    """Return the person an open password link is for. :raise LinkInvalid."""
    link = _open_link(token)
    return db.session.get(Person, link.person_id)


def use_password_link(token: str, password: str) -> Person:
    """Set the person's password from their link, and close every open link of theirs.

    :raise LinkInvalid: unknown, used or expired (also when another request used it first).
    :raise WeakPassword: the password is too short or too long.
    """
    link = _open_link(token)
    check_password_strength(password)
    now = utcnow()
    used = db.session.execute(
        update(PasswordLink)
        .where(PasswordLink.id == link.id, PasswordLink.used_at.is_(None))
        .values(used_at=now)
    )
    if used.rowcount != 1:
        db.session.rollback()
        raise LinkInvalid(_INVALID)
    db.session.execute(
        update(PasswordLink)
        .where(PasswordLink.person_id == link.person_id, PasswordLink.used_at.is_(None))
        .values(used_at=now)
    )
    stage_password(link.person_id, password)
    db.session.commit()
    return db.session.get(Person, link.person_id)


def _open_link(token: str) -> PasswordLink:
    link = db.session.scalar(
        select(PasswordLink).where(PasswordLink.token_digest == token_digest(token))
    )
    if link is None or link.used_at is not None or link.expires_at <= utcnow():
        raise LinkInvalid(_INVALID)
    return link


def start_sign_up(email: str, password: str) -> tuple[str, bool]:
    """Begin a sign-up confirmed by mail; return the token to mail, and whether ``email`` is known.

    For a new address the token confirms the sign-up; for a known one it is a password
    link, and nothing else changes. The password is hashed either way, so both take alike.
    :raise WeakPassword: the password is too short or too long.
    """
    check_password_strength(password)
    password_hash = hash_password(password)
    reset = request_password_reset(email)
    if reset is not None:
        return reset, True
    token, digest = new_token()
    db.session.add(
        PendingSignUp(
            email=normalize_email(email),
            password_hash=password_hash,
            token_digest=digest,
            expires_at=utcnow() + SIGN_UP_LIFETIME,
        )
    )
    db.session.commit()
    return token, False


def pending_sign_up_email(token: str) -> str:
    """Return the address an open sign-up link confirms. :raise LinkInvalid."""
    return _open_sign_up(token).email


def confirm_sign_up(token: str) -> Person:
    """Create the account of a pending sign-up, once.

    :raise LinkInvalid: unknown, used or expired. :raise AccountExists: the address got an
        account meanwhile (its password is not touched).
    """
    pending = _open_sign_up(token)
    used = db.session.execute(
        update(PendingSignUp)
        .where(PendingSignUp.id == pending.id, PendingSignUp.used_at.is_(None))
        .values(used_at=utcnow())
    )
    if used.rowcount != 1:
        db.session.rollback()
        raise LinkInvalid(_INVALID)
    try:
        return register_hashed(email=pending.email, password_hash=pending.password_hash)
    except AccountExists:
        db.session.commit()  # the link stays used: it cannot touch the account that exists
        raise


def _open_sign_up(token: str) -> PendingSignUp:
    pending = db.session.scalar(
        select(PendingSignUp).where(PendingSignUp.token_digest == token_digest(token))
    )
    if pending is None or pending.used_at is not None or pending.expires_at <= utcnow():
        raise LinkInvalid(_INVALID)
    return pending


def prune_expired_links(*, batch_size: int) -> int:
    """Delete up to ``batch_size`` password links and pending sign-ups past their time.

    Neither can be used once expired, and a pending sign-up keeps a password's hash: none
    is kept longer than it can serve. Return how many went (links first, then sign-ups).
    """
    pruned = _prune_expired(PasswordLink, batch_size)
    return pruned + _prune_expired(PendingSignUp, batch_size - pruned)


def _prune_expired(model: type[PasswordLink] | type[PendingSignUp], batch_size: int) -> int:
    expired = (
        select(model.id).where(model.expires_at <= utcnow()).order_by(model.expires_at)
    ).limit(batch_size)
    ids = list(db.session.scalars(expired)) if batch_size > 0 else []
    db.session.commit()
    if ids:
        statement = delete(model).where(model.id.in_(ids))
        write_transaction(lambda connection: connection.execute(statement))
    return len(ids)
