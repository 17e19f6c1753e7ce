"""What the statement tests share: a signing key, and the verifier run as a holder runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parent.parent
VERIFIER = ROOT / "tools" / "verify_statement.py"


def new_signing_pem() -> str:
    """Return a fresh Ed25519 private key in PEM, as an operator sets LEDGER_SIGNING_KEY."""
    return (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )


def public_pem_of(private_pem: str) -> bytes:
    """Return the public key of ``private_pem``, in PEM."""
    key = serialization.load_pem_private_key(private_pem.encode(), password=None)
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def verify(statement: Path, *options: str | Path) -> subprocess.CompletedProcess:
    """Run tools/verify_statement.py on ``statement`` as a holder would: apart from the app."""
    return subprocess.run(
        [sys.executable, str(VERIFIER), str(statement), *map(str, options)],
        capture_output=True,
        text=True,
        cwd=ROOT / "tools",
        timeout=60,
    )


def write_json(path: Path, statement: dict) -> Path:
    """Write ``statement`` to ``path`` as JSON; return the path."""
    path.write_text(json.dumps(statement, indent=1, ensure_ascii=False), encoding="utf-8")
    return path
