"""API key values: generate, parse, digest; and the caller a request's key names.

A key reads ``sk-gw-`` + 43 base62 characters (256 random bits from ``secrets``) + a
6-character base62 CRC32 of them. The fixed prefix lets secret scanners recognise a leaked
key; the checksum lets a mistyped or made-up key be refused before any database read.
Keys are issued and changed by their account's holder (``app.accounts.keys``).
"""

from __future__ import annotations

import hashlib
import secrets
import zlib
from dataclasses import dataclass

from flask import current_app
from sqlalchemy import bindparam, select

from app.auth.caller_cache import CALLER_CACHE
from app.auth.models import DELETED, ApiKey
from app.database import PREPARED_STATEMENTS_LOST, execute_alone

KEY_PREFIX = "sk-gw-"
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BODY_LENGTH = 43  # 62**43 > 2**256
CHECKSUM_LENGTH = 6  # 62**6 > 2**32
KEY_LENGTH = len(KEY_PREFIX) + BODY_LENGTH + CHECKSUM_LENGTH
DISPLAY_LENGTH = len(KEY_PREFIX) + 6
_ALPHABET_SET = frozenset(ALPHABET)
_keys = ApiKey.__table__
_FIND_CALLER = select(
    _keys.c.id,
    _keys.c.account_id,
    _keys.c.state,
    _keys.c.permitted_models,
).where(_keys.c.digest == bindparam("digest"))


@dataclass(frozen=True)
class Caller:
    """Who is calling: the key used and the account that pays."""

    key_id: int
    account_id: int
    state: str
    permitted_models: frozenset[str] | None = None
    # The digest of the key as presented: a hold applies only while the key still has it.
    key_digest: str | None = None

    def may_use(self, model_id: str) -> bool:
        """Return whether this key may call the model ``model_id``."""
        return self.permitted_models is None or model_id in self.permitted_models


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
    # Read once: every use of the current_app proxy looks the app's context up again.
    extensions = current_app._get_current_object().extensions
    cache = extensions.get(CALLER_CACHE)
    # Behind a pooler that moves sessions (found out by the prepared statements), the
    # listener's session is not the one notified: nothing is remembered.
    if cache is None or extensions.get(PREPARED_STATEMENTS_LOST):
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
        permitted_models=None if row.permitted_models is None else frozenset(row.permitted_models),
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
