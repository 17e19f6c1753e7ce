"""API key values: generate, parse, digest; and the key records' lifecycle.

A key reads ``sk-gw-`` + 43 base62 characters (256 random bits from ``secrets``) + a
6-character base62 CRC32 of them. The fixed prefix lets secret scanners recognise a leaked
key; the checksum lets a mistyped or made-up key be refused before any database read.
"""

from __future__ import annotations

import hashlib
import secrets
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, select, update

from app.auth.errors import KeyNotFound
from app.auth.models import ACTIVE, REVOKED, ApiKey
from app.credits.accounts import find_account_or_raise
from app.database import BoundStatement, utcnow
from app.extensions import db

KEY_PREFIX = "sk-gw-"
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BODY_LENGTH = 43  # 62**43 > 2**256
CHECKSUM_LENGTH = 6  # 62**6 > 2**32
KEY_LENGTH = len(KEY_PREFIX) + BODY_LENGTH + CHECKSUM_LENGTH
DISPLAY_LENGTH = len(KEY_PREFIX) + 6
_ALPHABET_SET = frozenset(ALPHABET)
LAST_USED_RESOLUTION = timedelta(minutes=1)
_keys = ApiKey.__table__
_FIND_CALLER = select(_keys.c.id, _keys.c.account_id, _keys.c.state, _keys.c.last_used_at).where(
    _keys.c.digest == bindparam("digest")
)
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
    # No commit: the request's next statement is the hold, which commits, so the lookup
    # and the hold share one connection checkout and one transaction.
    row = db.session.execute(_FIND_CALLER, {"digest": digest_key(value)}).first()
    if row is None:
        return None
    return Caller(
        key_id=row.id, account_id=row.account_id, state=row.state, last_used_at=row.last_used_at
    )


def _find_key_or_raise(key_id: int) -> ApiKey:
    key = db.session.get(ApiKey, key_id)
    if key is None:
        raise KeyNotFound(f"no API key with id {key_id}")
    return key


def create_key(*, email: str, name: str) -> IssuedKey:
    """Issue a new active key for the account with ``email``; raise AccountNotFound."""
    account = find_account_or_raise(email)
    value = generate_key()
    key = ApiKey(
        account_id=account.id,
        name=name,
        digest=digest_key(value),
        display_prefix=value[:DISPLAY_LENGTH],
        state=ACTIVE,
    )
    db.session.add(key)
    db.session.commit()
    return IssuedKey(id=key.id, value=value, display_prefix=key.display_prefix)


def rotate_key(key_id: int) -> IssuedKey:
    """Give key ``key_id`` a new value; the old one fails at once. Raise KeyNotFound."""
    key = _find_key_or_raise(key_id)
    value = generate_key()
    key.digest = digest_key(value)
    key.display_prefix = value[:DISPLAY_LENGTH]
    db.session.commit()
    return IssuedKey(id=key.id, value=value, display_prefix=key.display_prefix)


def revoke_key(key_id: int) -> ApiKey:
    """Revoke key ``key_id``: kept, but refused with 403. Raise KeyNotFound."""
    key = _find_key_or_raise(key_id)
    key.state = REVOKED
    db.session.commit()
    return key


def delete_key(key_id: int) -> None:
    """Remove key ``key_id`` for good. Raise KeyNotFound."""
    db.session.delete(_find_key_or_raise(key_id))
    db.session.commit()


def list_keys(email: str) -> list[ApiKey]:
    """Return the keys of the account with ``email``, oldest first; raise AccountNotFound."""
    account = find_account_or_raise(email)
    return list(
        db.session.scalars(
            select(ApiKey).where(ApiKey.account_id == account.id).order_by(ApiKey.id)
        )
    )


def key_use_records(caller: Caller, now: datetime | None = None) -> list[BoundStatement]:
    """Return the UPDATE recording the key's use, if its last use is older than a minute.

    It runs in the settle transaction; at most one write a minute per key keeps a busy
    key's row from becoming a point of contention.
    """
    now = now or utcnow()
    if caller.last_used_at is not None and now - caller.last_used_at < LAST_USED_RESOLUTION:
        return []
    return [(_TOUCH_KEY, {"key_id": caller.key_id, "now": now})]
