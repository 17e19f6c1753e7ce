"""Issuing and changing an account's API keys: names, limits, rotation, revocation, deletion.

A key may be limited to some of the served models and to a monthly spend in USD; the
ledger enforces the spend limit in the hold's transaction (see ``app.credits.holds``).
Every change that alters what a key's caller may do is told to the processes that
remember callers (``forget_remembered_callers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import select, update

from app.accounts.budgets import (
    apply_budget,
    checked_budget_amount,
    checked_lock,
    checked_window,
    lifts_limits,
    take_over_open_holds,
)
from app.accounts.changes import record_change
from app.accounts.errors import InvalidKeyLimits, KeyNotFound
from app.accounts.models import Membership
from app.accounts.organisations import owner_membership
from app.auth.keys import DISPLAY_LENGTH, digest_key, forget_remembered_callers, generate_key
from app.auth.models import ACTIVE, DELETED, REVOKED, ApiKey
from app.budgets import MONTH
from app.catalog.registry import current_catalog
from app.credits.models import Hold
from app.extensions import db


@dataclass(frozen=True)
class IssuedKey:
    """A freshly issued key: its record's id and the value, shown this once."""

    id: int
    value: str
    display_prefix: str


def _find_key_or_raise(key_id: int) -> ApiKey:
    key = db.session.get(ApiKey, key_id)
    if key is None or key.state == DELETED:
        raise KeyNotFound(f"no API key with id {key_id}")
    return key


def create_key(
    *,
    account_id: int,
    name: str,
    member_id: int | None = None,
    permitted_models: list[str] | None = None,
    monthly_limit: Decimal | None = None,
    actor: int | None = None,
) -> IssuedKey:
    """Issue a new active key for the account ``account_id``, optionally limited.

    The key belongs to the member ``member_id``, by default to the organisation's owner;
    ``actor`` is the person who asked (None: the operator), for the audit log.
    :raise InvalidKeyLimits: a model id is not served, or the limit is not a valid amount.
    :raise KeyNotFound: ``member_id`` is no member of the organisation.
    """
    member_id = _member_of_key(account_id, member_id)
    models = checked_permitted_models(permitted_models)
    limit = checked_budget_amount(monthly_limit, "the monthly limit")
    value = generate_key()
    key = ApiKey(
        account_id=account_id,
        member_id=member_id,
        name=name,
        digest=digest_key(value),
        display_prefix=value[:DISPLAY_LENGTH],
        state=ACTIVE,
        permitted_models=models,
        budget=limit,
        budget_locked=limit is not None and lifts_limits(actor, account_id),
    )
    db.session.add(key)
    db.session.flush()
    _record(actor, key, "key.create", {"member_id": member_id, "monthly_limit": _text(limit)})
    db.session.commit()
    return IssuedKey(id=key.id, value=value, display_prefix=key.display_prefix)


def _record(actor: int | None, key: ApiKey, action: str, detail: dict | None = None) -> None:
    record_change(
        actor, key.account_id, action, f"key:{key.id}", {"name": key.name, **(detail or {})}
    )


def _text(amount: Decimal | None) -> str | None:
    return None if amount is None else f"{amount:f}"


def _member_of_key(account_id: int, member_id: int | None) -> int:
    """Return the member a new key belongs to: ``member_id``, checked, or the owner."""
    if member_id is None:
        owner = owner_membership(account_id)
        if owner is None:
            raise KeyNotFound(f"the organisation {account_id} has no owner to hold the key")
        return owner.id
    member = db.session.get(Membership, member_id)
    if member is None or member.account_id != account_id or member.removed_at is not None:
        raise KeyNotFound(f"no member {member_id} in the organisation {account_id}")
    return member_id


def update_key_limits(
    key_id: int,
    *,
    permitted_models: list[str] | None,
    monthly_limit: Decimal | None,
    window: str = MONTH,
    actor: int | None = None,
) -> ApiKey:
    """Set the models key ``key_id`` may use and its limit a ``window`` (None: no limit).

    Every charge is kept on the key's row (see ``app.credits.settlement``), and a limit set
    takes over the holds of the key's running requests (app.accounts.budgets), so a
    limit set in the middle of a month counts what was already spent and what the key's
    running requests hold.

    ``actor`` (None: the operator) may lower a limit an owner or admin set, not lift it
    unless they are one (app.accounts.budgets.checked_lock).

    :raise InvalidKeyLimits: a model id is not served, the limit or window is not valid,
        or the actor may not lift the limit.
    :raise KeyNotFound: no key has ``key_id``.
    """
    models = checked_permitted_models(permitted_models)
    limit = checked_budget_amount(monthly_limit, "the monthly limit")
    window = checked_window(window)
    taken_over = take_over_open_holds(Hold.reserved_on_key, [key_id], limit)
    key = db.session.scalar(
        select(ApiKey).where(ApiKey.id == key_id, ApiKey.state != DELETED).with_for_update()
    )
    if key is None:
        db.session.rollback()
        raise KeyNotFound(f"no API key with id {key_id}")
    key.permitted_models = models
    key.budget_locked = checked_lock(key, limit, window, actor)
    apply_budget(key, limit, window, [key.id], taken_over)
    detail = {"permitted_models": models, "monthly_limit": _text(limit), "window": window}
    _record(actor, key, "key.limits", detail)
    db.session.commit()
    forget_remembered_callers()
    return key


def checked_permitted_models(permitted_models: list[str] | None) -> list[str] | None:
    """Return the model ids without repeats; raise InvalidKeyLimits unless all are served."""
    if permitted_models is None:
        return None
    if isinstance(permitted_models, str) or not all(
        isinstance(model_id, str) for model_id in permitted_models
    ):
        raise InvalidKeyLimits("permitted models must be a list of model ids")
    models = list(dict.fromkeys(permitted_models))
    if not models:
        raise InvalidKeyLimits("permitted models must name at least one model")
    served = current_catalog().models
    if unknown := [model_id for model_id in models if model_id not in served]:
        raise InvalidKeyLimits(f"unknown model id {unknown[0]!r}: not in the served catalog")
    return models


def rotate_key(key_id: int, actor: int | None = None) -> IssuedKey:
    """Give key ``key_id`` a new value; the old one fails at once. Raise KeyNotFound."""
    key = _find_key_or_raise(key_id)
    value = generate_key()
    key.digest = digest_key(value)
    key.display_prefix = value[:DISPLAY_LENGTH]
    _record(actor, key, "key.rotate")
    db.session.commit()
    forget_remembered_callers()
    return IssuedKey(id=key.id, value=value, display_prefix=key.display_prefix)


def revoke_key(key_id: int, actor: int | None = None) -> ApiKey:
    """Revoke key ``key_id``: kept, but refused with 403. Raise KeyNotFound."""
    key = _find_key_or_raise(key_id)
    key.state = REVOKED
    _record(actor, key, "key.revoke")
    db.session.commit()
    forget_remembered_callers()
    return key


def delete_key(key_id: int, actor: int | None = None) -> None:
    """Delete key ``key_id`` for good: its value is unknown from now on. Raise KeyNotFound.

    The row stays, in state ``deleted`` and without its digest (see ``ApiKey``).
    """
    key = _find_key_or_raise(key_id)
    key.state = DELETED
    # Unique like a digest, but never the sha256 hex of a key (it has a non-hex letter).
    key.digest = f"deleted-{key.id}"
    _record(actor, key, "key.delete")
    db.session.commit()
    forget_remembered_callers()


def organisation_of_key(key_id: int) -> int:
    """Return the id of the organisation key ``key_id`` belongs to. :raise KeyNotFound."""
    return _find_key_or_raise(key_id).account_id


def list_keys(account_id: int) -> list[ApiKey]:
    """Return the keys (not deleted) of the account ``account_id``, oldest first."""
    return list(
        db.session.scalars(
            select(ApiKey)
            .where(ApiKey.account_id == account_id, ApiKey.state != DELETED)
            .order_by(ApiKey.id)
        )
    )


def stage_revoke_member_keys(member_id: int) -> int:
    """Revoke the member's active keys in the session; return how many, for the caller to commit.

    The caller tells the processes that remember callers once it committed.
    """
    revoked = db.session.execute(
        update(ApiKey)
        .where(ApiKey.member_id == member_id, ApiKey.state == ACTIVE)
        .values(state=REVOKED)
    )
    return revoked.rowcount
