"""Callers' ``Idempotency-Key``: a retried request gets the first answer, not a second charge.

A key is claimed before the request runs. A whole (non-streamed) answer is stored with
the claim and replayed to a retry with the same key and body for 24 hours; a failed
request gives its claim back so that the retry runs anew. A streamed answer cannot be
replayed: its key stays used, so a retry is refused rather than charged again.

A claim left without an answer by a worker that died outlives it only as long as a credit
hold does (``HOLD_TTL_SECONDS``): after that a retry takes the key over. Claims and
answers past their 24 hours are pruned by the sweeper, a batch at a time. A request's
own writes to its claim run as the hold's do (``write_transaction``), so that on SQLite
they wait for the write lock without stalling the worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Executable, delete, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.completions.models import IdempotentRequest
from app.database import utcnow, write_transaction
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


def claim_key(*, account_id: int, key: str, body_digest: str, claim_ttl_seconds: int) -> Claim:
    """Claim ``key`` for a request, or return the first answer to replay.

    A claim without an answer older than ``claim_ttl_seconds`` belonged to a request whose
    worker died; it is taken over.

    :raise IdempotencyKeyReused: the key was used with another body.
    :raise IdempotencyKeyInUse: its request is still running, or was streamed.
    """

    def claim(connection: Connection) -> int:
        connection.execute(
            delete(IdempotentRequest).where(
                IdempotentRequest.account_id == account_id,
                IdempotentRequest.key == key,
                IdempotentRequest.created_at < utcnow() - REPLAY_WINDOW,
            )
        )
        return connection.execute(
            insert(IdempotentRequest)
            .values(account_id=account_id, key=key, body_digest=body_digest)
            .returning(IdempotentRequest.id)
        ).scalar_one()

    try:
        return Claim(id=write_transaction(claim))
    except IntegrityError:
        return _existing_claim(account_id, key, body_digest, claim_ttl_seconds)


def _existing_claim(account_id: int, key: str, body_digest: str, claim_ttl_seconds: int) -> Claim:
    first = db.session.scalar(
        select(IdempotentRequest).where(
            IdempotentRequest.account_id == account_id, IdempotentRequest.key == key
        )
    )
    db.session.commit()
    retry = {"account_id": account_id, "key": key, "body_digest": body_digest}
    if first is None:  # released between our insert and this read: the retry may go on
        return claim_key(**retry, claim_ttl_seconds=claim_ttl_seconds)
    if first.body_digest != body_digest:
        raise IdempotencyKeyReused()
    if first.response is not None:
        return Claim(id=first.id, replay=first.response)
    if first.streamed:
        raise IdempotencyKeyInUse(
            "This Idempotency-Key was used for a streamed request, which cannot be replayed."
        )
    if first.created_at < utcnow() - timedelta(seconds=claim_ttl_seconds):
        _drop_abandoned_claim(first.id)
        return claim_key(**retry, claim_ttl_seconds=claim_ttl_seconds)
    raise IdempotencyKeyInUse(
        "A request with this Idempotency-Key is still in progress. Retry later."
    )


def _drop_abandoned_claim(claim_id: int) -> None:
    """Delete a claim that never got an answer; a concurrent retry may have done it first."""
    _write(
        delete(IdempotentRequest).where(
            IdempotentRequest.id == claim_id,
            IdempotentRequest.response.is_(None),
            IdempotentRequest.streamed.is_(False),
        )
    )


def prune_expired_claims(*, batch_size: int) -> int:
    """Delete up to ``batch_size`` claims past the replay window; return how many went."""
    expired = (
        select(IdempotentRequest.id)
        .where(IdempotentRequest.created_at < utcnow() - REPLAY_WINDOW)
        .order_by(IdempotentRequest.created_at)
        .limit(batch_size)
    )
    ids = list(db.session.scalars(expired))
    if ids:
        db.session.execute(delete(IdempotentRequest).where(IdempotentRequest.id.in_(ids)))
    db.session.commit()
    return len(ids)


def store_answer(claim: Claim, response_body: bytes) -> None:
    """Keep the whole answer of the claim's request, to replay it."""
    _update_claim(claim, response=response_body)


def mark_streamed(claim: Claim) -> None:
    """Record that the claim's answer was streamed, so a retry is refused, not replayed."""
    _update_claim(claim, streamed=True)


def _update_claim(claim: Claim, **values: object) -> None:
    _write(update(IdempotentRequest).where(IdempotentRequest.id == claim.id).values(**values))


def release_claim(claim: Claim) -> None:
    """Give the key back: the request failed, and a retry should run anew."""
    # Whatever the failed request left open in its session goes first: on SQLite a write
    # it began would hold the lock this release waits for.
    db.session.rollback()
    _write(delete(IdempotentRequest).where(IdempotentRequest.id == claim.id))


def _write(statement: Executable) -> None:
    """Run one statement in a transaction of its own, as the hold's writes run."""
    write_transaction(lambda connection: connection.execute(statement))
