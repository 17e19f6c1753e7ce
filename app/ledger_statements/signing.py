"""The operator's Ed25519 key, and how a statement is signed with it.

The key is LEDGER_SIGNING_KEY (PEM). Without it, a development or test instance makes
one once and keeps it in its instance folder (``ledger_signing_key.pem``, mode 0600);
production refuses to sign (SigningKeyMissing) rather than sign with a key nobody can
check against later.

A statement is signed over its canonical form: the statement without ``signature``,
encoded as JSON with sorted keys, no whitespace, non-ASCII characters as themselves,
in UTF-8. The signature (Ed25519, over those bytes) is written in base64; ``key_id`` is
the SHA-256 of the raw 32-byte public key, in hex, and ``public_key`` that raw key in
base64.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flask import current_app

from app.ledger_statements.errors import SigningKeyMissing

KEY_FILE = "ledger_signing_key.pem"


def load_private_key(pem: str) -> Ed25519PrivateKey:
    """Return the Ed25519 private key of ``pem``. :raise ValueError: it holds none."""
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as error:
        raise ValueError("must be an unencrypted Ed25519 private key in PEM") from error
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("must be an Ed25519 private key (PEM), not another kind of key")
    return key


@functools.cache
def _loaded(pem: str) -> Ed25519PrivateKey:
    return load_private_key(pem)


def signing_key(*, configured: str | None, env_name: str, instance_path: str) -> Ed25519PrivateKey:
    """Return the configured key, else (not in production) the instance folder's.

    :raise SigningKeyMissing: production, and no key configured.
    """
    if configured:
        return _loaded(configured)
    if env_name == "production":
        raise SigningKeyMissing()
    return _loaded(_instance_key(Path(instance_path) / KEY_FILE))


def current_signing_key() -> Ed25519PrivateKey:
    """Return the app's signing key (signing_key). :raise SigningKeyMissing."""
    return signing_key(
        configured=current_app.config.get("LEDGER_SIGNING_KEY"),
        env_name=current_app.config.get("ENV_NAME", ""),
        instance_path=current_app.instance_path,
    )


def _instance_key(path: Path) -> str:
    """Return the PEM kept at ``path``, made first if there is none.

    Made aside and linked into place, so that workers starting together keep one key.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        pem = Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        aside = path.with_name(f".{path.name}.{os.getpid()}")
        descriptor = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(pem)
        try:
            os.link(aside, path)
        except FileExistsError:
            pass  # another process made it first: its key is the one
        finally:
            aside.unlink()
    return path.read_text()


def raw_public_key(key: Ed25519PrivateKey) -> bytes:
    """Return the 32 bytes of ``key``'s public key."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PrivateKey) -> str:
    """Return the id of ``key``: the SHA-256 of its raw public key, in hex."""
    return hashlib.sha256(raw_public_key(key)).hexdigest()


def public_pem(key: Ed25519PrivateKey) -> str:
    """Return ``key``'s public key in PEM (SubjectPublicKeyInfo)."""
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def canonical_bytes(statement: dict[str, Any]) -> bytes:
    """Return what is signed of ``statement``: its canonical JSON without ``signature``."""
    unsigned = {name: value for name, value in statement.items() if name != "signature"}
    text = json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8")


def signed(statement: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """Return ``statement`` with the key's id and public key, signed by ``key``."""
    statement = {
        **statement,
        "key_id": key_id(key),
        "public_key": base64.b64encode(raw_public_key(key)).decode(),
    }
    signature = key.sign(canonical_bytes(statement))
    return {**statement, "signature": base64.b64encode(signature).decode()}
