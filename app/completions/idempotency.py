"""Callers' ``Idempotency-Key``: a retried request gets the first answer, not a second charge.

A key is claimed before the request runs. A whole (non-streamed) answer is stored with
the claim and replayed to a retry with the same key and body for 24 hours; a failed
request gives its claim back so that the retry runs anew. A streamed answer cannot be
replayed: its key stays used, so a retry is refused rather than charged again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from app.completions.models import IdempotentRequest
from app.database import utcnow
from app.errors import APIError
from app.extensions import db

REPLAY_WINDOW = timedelta(hours=24)
MAX_KEY_LENGTH = 255


class IdempotencyKeyInvalid(APIError):
    """The Idempotency-Key header is empty or too long."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_idempotency_key"
    default_message = f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} printable characters."


class IdempotencyKeyReused(APIError):
    """The key was used with a different request body."""

    status = 400
    type = "invalid_request_error"
    code = "idempotency_key_reused"
    default_message = (
        "This Idempotency-Key was already used with a different request body. "
        "Use a new key for a new request."
    )


class IdempotencyKeyInUse(APIError):
    """The key's first request is still running, or was streamed and cannot be replayed."""

    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_in_use"


@dataclass(frozen=True)
class Claim:
    """A claimed key; ``replay`` holds the first answer when there is one to repeat."""

    id: int
    replay: bytes | None = None


def check_key(key: str) -> str:
    """Return ``key`` if usable; raise IdempotencyKeyInvalid."""
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise IdempotencyKeyInvalid()
    return key


def claim_key(*, account_id: int, key: str, body_digest: str) -> Claim:
    """Claim ``key`` for a request, or return the first answer to replay.

    :raise IdempotencyKeyReused: the key was used with another body.
    :raise IdempotencyKeyInUse: its request is still running, or was streamed.
    """
    db.session.execute(
        delete(IdempotentRequest).where(
            IdempotentRequest.account_id == account_id,
            IdempotentRequest.key == key,
            IdempotentRequest.created_at < utcnow() - REPLAY_WINDOW,
        )
    )
    claim = IdempotentRequest(account_id=account_id, key=key, body_digest=body_digest)
    db.session.add(claim)
    try:
        db.session.commit()
        return Claim(id=claim.id)
    except IntegrityError:
        db.session.rollback()
    return _existing_claim(account_id, key, body_digest)


def _existing_claim(account_id: int, key: str, body_digest: str) -> Claim:
    first = db.session.scalar(
        select(IdempotentRequest).where(
            IdempotentRequest.account_id == account_id, IdempotentRequest.key == key
        )
    )
    db.session.commit()
    if first is None:  # released between our insert and this read: the retry may go on
        return claim_key(account_id=account_id, key=key, body_digest=body_digest)
    if first.body_digest != body_digest:
        raise IdempotencyKeyReused()
    if first.response is not None:
        return Claim(id=first.id, replay=first.response)
    if first.streamed:
        raise IdempotencyKeyInUse(
            "This Idempotency-Key was used for a streamed request, which cannot be replayed."
        )
    raise IdempotencyKeyInUse(
        "A request with this Idempotency-Key is still in progress. Retry later."
    )


def store_answer(claim: Claim, response_body: bytes) -> None:
    """Keep the whole answer of the claim's request, to replay it."""
    _update_claim(claim, response=response_body)


def mark_streamed(claim: Claim) -> None:
    """Record that the claim's answer was streamed, so a retry is refused, not replayed."""
    _update_claim(claim, streamed=True)


def _update_claim(claim: Claim, **values: object) -> None:
    db.session.execute(
        update(IdempotentRequest).where(IdempotentRequest.id == claim.id).values(**values)
    )
    db.session.commit()


def release_claim(claim: Claim) -> None:
    """Give the key back: the request failed, and a retry should run anew."""
    db.session.rollback()
    db.session.execute(delete(IdempotentRequest).where(IdempotentRequest.id == claim.id))
    db.session.commit()
