"""People, their memberships of organisations, invites, and the log of who changed what.

An organisation is an ``accounts`` row (app.credits.models.Account): it keeps the balance,
the ledger, the holds and the keys. People sign in; a membership gives a person a role in
one organisation.
"""

from __future__ import annotations

from sqlalchemy import JSON, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.budgets import BudgetCounters
from app.database import UTCDateTime, utcnow
from app.extensions import db

# A member's role, from the most to the least it may do: the owner may do everything
# (billing, deleting the organisation); an admin manages members, keys, budgets, alerts;
# a member their own keys and usage.
OWNER, ADMIN, MEMBER = "owner", "admin", "member"
ROLES = (OWNER, ADMIN, MEMBER)
RANK = {OWNER: 3, ADMIN: 2, MEMBER: 1}


def has_role(role: str | None, needed: str) -> bool:
    """Return whether ``role`` may do what ``needed`` may (None, no member, may nothing)."""
    return role is not None and RANK[role] >= RANK[needed]


class Person(db.Model):
    """Someone who signs in to the dashboard: once, whatever organisations they belong to.

    ``password_hash`` is an Argon2id hash; None until the person sets a password from an
    invite. ``is_admin`` marks the gateway's operators.
    """

    __tablename__ = "people"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    password_hash: Mapped[str | None] = mapped_column(String(255), nullable=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    is_admin: Mapped[bool] = mapped_column(default=False)


class Membership(BudgetCounters, db.Model):
    """A person's role in one organisation; ``removed_at`` is set when they leave.

    A removed membership's row stays, so that its keys and their history stay attributed.
    The member's budget (``BudgetCounters``) counts the spend of all their keys.
    """

    __tablename__ = "memberships"
    __table_args__ = (UniqueConstraint("account_id", "person_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    person_id: Mapped[int] = mapped_column(ForeignKey("people.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(16))
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    removed_at = mapped_column(UTCDateTime, nullable=True)


class AccountInvite(db.Model):
    """A one-time link that makes the holder of an address a member with a role.

    Bound to ``email``, the address it was sent to: whoever signs in with it accepts it.
    ``inviter_id`` is the member who made it (None: the operator's command); it stays open
    only while they keep the role that allowed it (app.accounts.invites). Only the sha256
    of the link's token is stored: the token has 256 random bits, so a leaked table gives
    nothing to guess from, and lookup stays one indexed equality.
    """

    __tablename__ = "account_invites"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(
        ForeignKey("accounts.id", ondelete="CASCADE"), index=True
    )
    email: Mapped[str] = mapped_column(String(320))
    role: Mapped[str] = mapped_column(String(16))
    inviter_id: Mapped[int | None] = mapped_column(
        ForeignKey("people.id", ondelete="SET NULL"), nullable=True
    )
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    expires_at = mapped_column(UTCDateTime, nullable=False)
    used_at = mapped_column(UTCDateTime, nullable=True)
    revoked_at = mapped_column(UTCDateTime, nullable=True)


class PasswordLink(db.Model):
    """A one-time link where a person sets their password: the only way but sign-up.

    The operator issues one (``flask accounts invite``, ``flask accounts password-link``)
    or the person asks for one mailed to their address. Only the token's sha256 is kept.
    """

    __tablename__ = "password_links"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    person_id: Mapped[int] = mapped_column(ForeignKey("people.id", ondelete="CASCADE"), index=True)
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    purpose: Mapped[str] = mapped_column(String(16))
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    expires_at = mapped_column(UTCDateTime, nullable=False)
    used_at = mapped_column(UTCDateTime, nullable=True)


class PendingSignUp(db.Model):
    """A sign-up waiting for its address to be confirmed (when mail is set up).

    The password chosen is kept only as its Argon2id hash; the account is made when the
    link mailed to ``email`` is opened, unless the address has an account by then.
    """

    __tablename__ = "pending_signups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(320))
    password_hash: Mapped[str] = mapped_column(String(255))
    token_digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
    expires_at = mapped_column(UTCDateTime, nullable=False)
    used_at = mapped_column(UTCDateTime, nullable=True)


class Change(db.Model):
    """One entry of an organisation's audit log: who changed what, and when.

    ``actor_id`` is the person who made the change, None for the operator's commands;
    ``subject`` names what changed (``member:7``, ``key:12``), ``detail`` how.
    """

    __tablename__ = "changes"
    __table_args__ = (Index("ix_changes_account_id_id", "account_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    actor_id: Mapped[int | None] = mapped_column(
        ForeignKey("people.id", ondelete="SET NULL"), nullable=True
    )
    action: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(100))
    detail = mapped_column(JSON, nullable=True)
    created_at = mapped_column(UTCDateTime, nullable=False, default=utcnow)
