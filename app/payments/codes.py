"""Redemption codes: credit an operator hands out, redeemed once, before it expires.

A code reads ``gc_<id>_<secret>``; it is shown once, when made, and only its SHA-256
digest is kept. Its ``id`` names it in the ledger. Redeeming is one conditional UPDATE
(not redeemed, not expired) and the grant, in one transaction: of two redemptions at
once, one finds the code taken.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import or_, select, update
from sqlalchemy.engine import Connection

from app.credits.grants import grant_within
from app.database import utcnow, write_transaction
from app.extensions import db
from app.payments.models import RedemptionCode

codes = RedemptionCode.__table__
PREFIX = "gc_"


class CodeRefused(ValueError):
    """A code that cannot be redeemed: unknown, redeemed already, or expired."""


def digest_of(code: str) -> str:
    """Return the digest a code is kept as."""
    return hashlib.sha256(code.strip().encode()).hexdigest()


def create_codes(amount: Decimal, count: int = 1, expires_days: int | None = None) -> list[str]:
    """Make ``count`` codes worth ``amount`` USD each; return them, the only time they are seen."""
    now = utcnow()
    expires_at = now + timedelta(days=expires_days) if expires_days else None
    made = []
    for _ in range(count):
        code_id = secrets.token_hex(5)
        code = f"{PREFIX}{code_id}_{secrets.token_urlsafe(24)}"
        db.session.add(
            RedemptionCode(
                id=code_id,
                digest=digest_of(code),
                amount=amount,
                created_at=now,
                expires_at=expires_at,
            )
        )
        made.append(code)
    db.session.commit()
    return made


def redeem(account_id: int, code: str) -> RedemptionCode:
    """Grant the code's credit to the organisation; return the code (its id and amount).

    :raise CodeRefused: it is unknown, redeemed already, or expired.
    """
    digest = digest_of(code)
    now = utcnow()
    code_id = write_transaction(lambda connection: _redeem(connection, account_id, digest, now))
    if code_id is None:
        raise CodeRefused(_why_refused(digest, now))
    return db.session.get(RedemptionCode, code_id)


def _redeem(connection: Connection, account_id: int, digest: str, now: datetime) -> str | None:
    taken = connection.execute(
        update(codes)
        .where(
            codes.c.digest == digest,
            codes.c.redeemed_by.is_(None),
            or_(codes.c.expires_at.is_(None), codes.c.expires_at > now),
        )
        .values(redeemed_by=account_id, redeemed_at=now)
        .returning(codes.c.id, codes.c.amount)
    ).first()
    if taken is None:
        return None
    grant_within(
        connection,
        account_id=account_id,
        amount=taken.amount,
        idempotency_key=f"code:{taken.id}",
        description=f"redemption code {PREFIX}{taken.id}",
    )
    return taken.id


def _why_refused(digest: str, now: datetime) -> str:
    code = db.session.scalar(select(RedemptionCode).where(RedemptionCode.digest == digest))
    db.session.commit()
    if code is None:
        return "This code is not valid."
    if code.redeemed_by is not None:
        return "This code was redeemed already."
    return "This code has expired."
