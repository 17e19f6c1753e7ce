"""API key values: generate, parse, digest; and the key records' lifecycle.

A key reads ``sk-gw-`` + 43 base62 characters (256 random bits from ``secrets``) + a
6-character base62 CRC32 of them. The fixed prefix lets secret scanners recognise a leaked
key; the checksum lets a mistyped or made-up key be refused before any database read.

A key may be limited to some of the served models and to a monthly spend in USD; the
ledger enforces the spend limit in the hold's transaction (see ``app.credits.ledger``).
"""

from __future__ import annotations

import hashlib
import secrets
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from flask import current_app
from sqlalchemy import bindparam, func, select, update

from app.auth.caller_cache import CALLER_CACHE
from app.auth.errors import InvalidKeyLimits, KeyNotFound
from app.auth.models import ACTIVE, DELETED, REVOKED, ApiKey
from app.catalog.registry import current_catalog
from app.credits.accounts import find_account_or_raise
from app.credits.ledger import spend_month
from app.database import PREPARED_STATEMENTS_LOST, BoundStatement, execute_alone, utcnow
from app.extensions import db
from app.generations.models import Generation

KEY_PREFIX = "sk-gw-"
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BODY_LENGTH = 43  # 62**43 > 2**256
CHECKSUM_LENGTH = 6  # 62**6 > 2**32
KEY_LENGTH = len(KEY_PREFIX) + BODY_LENGTH + CHECKSUM_LENGTH
DISPLAY_LENGTH = len(KEY_PREFIX) + 6
_ALPHABET_SET = frozenset(ALPHABET)
LAST_USED_RESOLUTION = timedelta(minutes=1)
LIMIT_DECIMAL_PLACES = 6
LIMIT_QUANTUM = Decimal(1).scaleb(-LIMIT_DECIMAL_PLACES)
# Money is stored as a 64-bit count of 1e-10 USD; a limit stays well within it.
MAX_MONTHLY_LIMIT = Decimal(100_000_000)
_keys = ApiKey.__table__
_FIND_CALLER = select(
    _keys.c.id,
    _keys.c.account_id,
    _keys.c.state,
    _keys.c.last_used_at,
    _keys.c.permitted_models,
    _keys.c.monthly_limit,
).where(_keys.c.digest == bindparam("digest"))
_TOUCH_KEY = (
    update(_keys).where(_keys.c.id == bindparam("key_id")).values(last_used_at=bindparam("now"))
)


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key used and the account that pays."""

    key_id: int
    account_id: int
    state: str
    last_used_at: datetime | None = None
    permitted_models: frozenset[str] | None = None
    monthly_limit: Decimal | None = None
    # The digest of the key as presented: a hold applies only while the key still has it.
    key_digest: str | None = None

    def may_use(self, model_id: str) -> bool:
        """Return whether this key may call the model ``model_id``."""
        return self.permitted_models is None or model_id in self.permitted_models


@dataclass(frozen=True)
class IssuedKey:
    """A freshly issued key: its record's id and the value, shown this once."""

    id: int
    value: str
    display_prefix: str


def _base62(number: int, length: int) -> str:
    digits = []
    for _ in range(length):
        number, remainder = divmod(number, 62)
        digits.append(ALPHABET[remainder])
    return "".join(reversed(digits))


def _checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode()), CHECKSUM_LENGTH)


def generate_key() -> str:
    """Return a new key value."""
    body = _base62(secrets.randbits(256), BODY_LENGTH)
    return KEY_PREFIX + body + _checksum(body)


def parse_key(raw: str | None) -> str | None:
    """Return ``raw`` if it is well-formed (prefix, length, alphabet, checksum), else None."""
    if not raw or len(raw) != KEY_LENGTH or not raw.startswith(KEY_PREFIX):
        return None
    body = raw[len(KEY_PREFIX) : -CHECKSUM_LENGTH]
    if not _ALPHABET_SET.issuperset(body):
        return None
    if not secrets.compare_digest(raw[-CHECKSUM_LENGTH:], _checksum(body)):
        return None
    return raw


def digest_key(value: str) -> str:
    """Return the hex sha256 under which a key is stored."""
    return hashlib.sha256(value.encode()).hexdigest()


def find_caller(raw: str | None) -> Caller | None:
    """Return the caller presenting ``raw``, or None if it is malformed or unknown."""
    value = parse_key(raw)
    if value is None:
        return None
    cache = current_app.extensions.get(CALLER_CACHE)
    # Behind a pooler that moves sessions (found out by the prepared statements), the
    # listener's session is not the one notified: nothing is remembered.
    if cache is None or current_app.extensions.get(PREPARED_STATEMENTS_LOST):
        return _look_up_caller(digest_key(value))
    return cache.find(digest_key(value), _look_up_caller)


def _look_up_caller(digest: str) -> Caller | None:
    # On a connection of its own, back in the pool at once: the request may wait for its
    # caller's body next, and a pooled connection must not wait with it.
    rows = execute_alone(_FIND_CALLER, {"digest": digest}, prepared=True)
    row = rows[0] if rows else None
    if row is None or row.state == DELETED:
        return None
    return Caller(
        key_id=row.id,
        account_id=row.account_id,
        state=row.state,
        last_used_at=row.last_used_at,
        permitted_models=None if row.permitted_models is None else frozenset(row.permitted_models),
        monthly_limit=row.monthly_limit,
        key_digest=digest,
    )


def forget_remembered_callers() -> None:
    """Forget the callers this process remembers, after a change to a key committed.

    This one must not wait to hear of it to answer its next request right; the others
    hear of it as app.auth.caller_cache tells (on SQLite, from this call).
    """
    cache = current_app.extensions.get(CALLER_CACHE)
    if cache is not None:
        cache.key_changed()


def _find_key_or_raise(key_id: int) -> ApiKey:
    key = db.session.get(ApiKey, key_id)
    if key is None or key.state == DELETED:
        raise KeyNotFound(f"no API key with id {key_id}")
    return key


def create_key(
    *,
    email: str,
    name: str,
    permitted_models: list[str] | None = None,
    monthly_limit: Decimal | None = None,
) -> IssuedKey:
    """Issue a new active key for the account with ``email``, optionally limited.

    :raise AccountNotFound: no account has ``email``.
    :raise InvalidKeyLimits: a model id is not served, or the limit is not a valid amount.
    """
    models = checked_permitted_models(permitted_models)
    limit = checked_monthly_limit(monthly_limit)
    account = find_account_or_raise(email)
    value = generate_key()
    key = ApiKey(
        account_id=account.id,
        name=name,
        digest=digest_key(value),
        display_prefix=value[:DISPLAY_LENGTH],
        state=ACTIVE,
        permitted_models=models,
        monthly_limit=limit,
        spend_month=spend_month(utcnow()),
        month_spent=Decimal(0),
        month_reserved=Decimal(0),
    )
    db.session.add(key)
    db.session.commit()
    return IssuedKey(id=key.id, value=value, display_prefix=key.display_prefix)


def update_key_limits(
    key_id: int, *, permitted_models: list[str] | None, monthly_limit: Decimal | None
) -> ApiKey:
    """Set the models key ``key_id`` may use and its monthly limit (None: no limit).

    Every hold and charge is kept on the key's row (see ``app.credits.ledger``), so a
    limit set in the middle of a month counts what was already spent and what the key's
    running requests hold.

    :raise InvalidKeyLimits: a model id is not served, or the limit is not a valid amount.
    :raise KeyNotFound: no key has ``key_id``.
    """
    models = checked_permitted_models(permitted_models)
    limit = checked_monthly_limit(monthly_limit)
    key = db.session.scalar(
        select(ApiKey).where(ApiKey.id == key_id, ApiKey.state != DELETED).with_for_update()
    )
    if key is None:
        db.session.rollback()
        raise KeyNotFound(f"no API key with id {key_id}")
    key.permitted_models = models
    key.monthly_limit = limit
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


def checked_monthly_limit(monthly_limit: Decimal | None) -> Decimal | None:
    """Return the limit if it is a valid USD amount; raise InvalidKeyLimits otherwise."""
    if monthly_limit is None:
        return None
    if isinstance(monthly_limit, bool) or not isinstance(monthly_limit, Decimal | int):
        raise InvalidKeyLimits("the monthly limit must be an amount in USD")
    limit = Decimal(monthly_limit)
    if not limit.is_finite():
        raise InvalidKeyLimits("the monthly limit must be an amount in USD")
    if limit < 0:
        raise InvalidKeyLimits(f"the monthly limit must not be negative: {limit}")
    if limit > MAX_MONTHLY_LIMIT:
        raise InvalidKeyLimits(f"the monthly limit must be at most {MAX_MONTHLY_LIMIT} USD")
    if limit != limit.quantize(LIMIT_QUANTUM):
        raise InvalidKeyLimits(
            f"the monthly limit has more than {LIMIT_DECIMAL_PLACES} decimal places: {limit}"
        )
    return limit


def key_spend(key_id: int, *, since: datetime) -> Decimal:
    """Return what the generations of key ``key_id`` were charged since ``since``."""
    spent = _spent_since(key_id, since)
    db.session.commit()
    return spent


def _spent_since(key_id: int, since: datetime) -> Decimal:
    total = db.session.scalar(
        select(func.sum(Generation.cost)).where(
            Generation.api_key_id == key_id, Generation.created_at >= since
        )
    )
    return total if total is not None else Decimal(0)


def rotate_key(key_id: int) -> IssuedKey:
    """Give key ``key_id`` a new value; the old one fails at once. Raise KeyNotFound."""
    key = _find_key_or_raise(key_id)
    value = generate_key()
    key.digest = digest_key(value)
    key.display_prefix = value[:DISPLAY_LENGTH]
    db.session.commit()
    forget_remembered_callers()
    return IssuedKey(id=key.id, value=value, display_prefix=key.display_prefix)


def revoke_key(key_id: int) -> ApiKey:
    """Revoke key ``key_id``: kept, but refused with 403. Raise KeyNotFound."""
    key = _find_key_or_raise(key_id)
    key.state = REVOKED
    db.session.commit()
    forget_remembered_callers()
    return key


def delete_key(key_id: int) -> None:
    """Delete key ``key_id`` for good: its value is unknown from now on. Raise KeyNotFound.

    The row stays, in state ``deleted`` and without its digest (see ``ApiKey``).
    """
    key = _find_key_or_raise(key_id)
    key.state = DELETED
    # Unique like a digest, but never the sha256 hex of a key (it has a non-hex letter).
    key.digest = f"deleted-{key.id}"
    db.session.commit()
    forget_remembered_callers()


def list_keys(email: str) -> list[ApiKey]:
    """Return the keys (not deleted) of the account ``email``, oldest first.

    :raise AccountNotFound: no account has ``email``.
    """
    account = find_account_or_raise(email)
    return list(
        db.session.scalars(
            select(ApiKey)
            .where(ApiKey.account_id == account.id, ApiKey.state != DELETED)
            .order_by(ApiKey.id)
        )
    )


def key_use_records(caller: Caller, now: datetime | None = None) -> list[BoundStatement]:
    """Return the UPDATE recording the key's use, if its last use is older than a minute.

    It runs in the settle transaction; at most one write a minute per key keeps a busy
    key's row from becoming a point of contention. A caller this process remembers is
    told of the use, so that its next requests do not write it again.
    """
    now = now or utcnow()
    if caller.last_used_at is not None and now - caller.last_used_at < LAST_USED_RESOLUTION:
        return []
    if (cache := current_app.extensions.get(CALLER_CACHE)) is not None:
        cache.note_use(caller, now)
    return [(_TOUCH_KEY, {"key_id": caller.key_id, "now": now})]
