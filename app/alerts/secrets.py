"""Webhook signing secrets: made, shown once, kept sealed.

A secret must be read back to sign each delivery, so it cannot be hashed like a key.
It is sealed with Fernet (AES-128-CBC with an HMAC-SHA256) under a key derived from
SECRET_KEY: a copy of the database alone does not reveal it. Rotating SECRET_KEY makes
the sealed secrets unreadable: endpoints are then added again.
"""

from __future__ import annotations

import base64
import hashlib
import secrets

from cryptography.fernet import Fernet
from flask import current_app

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """Return a new signing secret, 32 random bytes as hex behind a recognisable prefix."""
    return SECRET_PREFIX + secrets.token_hex(32)


def seal(secret: str) -> str:
    """Return ``secret`` encrypted for storage."""
    return _fernet().encrypt(secret.encode()).decode()


def unseal(sealed: str) -> str:
    """Return the secret ``sealed`` holds. :raise cryptography.fernet.InvalidToken."""
    return _fernet().decrypt(sealed.encode()).decode()


def _fernet() -> Fernet:
    # A key of its own, so that the sessions' signing key is never used as it is.
    material = b"gateway alert secrets\0" + current_app.config["SECRET_KEY"].encode()
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(material).digest()))
