"""Callers' ``Idempotency-Key``: a retried request gets the first answer, not a second charge.

A key is claimed before the request runs, and the claim names the generation that will
run it: the generation's hold and its record carry that id. A whole (non-streamed)
answer is stored with the claim and replayed to a retry with the same key and body for
24 hours; a request that failed before anything was charged gives its claim back so that
the retry runs anew. Once its generation was charged, the claim stays bound to it, even
if what failed came after (storing the answer): the retry gets the stored answer, or is
told that it was lost, and is never charged again. A streamed
answer cannot be replayed: its key stays used, so a retry is refused rather than charged
again.

A claim without an answer is asked about its generation, so that no crash can charge the
same key twice. While the generation's hold is open (its worker renews it while the
request runs, however long) the retry is told the request is in progress. Once the
generation is recorded, it was charged, and its answer was lost with its worker before it
could be stored: the retry is told so, with the generation's id, and nothing runs again.
Only a claim whose generation never held credit (or was released uncharged) and is older
than a hold's TTL (``HOLD_TTL_SECONDS``) is taken over by the retry. Its request may only
have stalled (its worker renewed nothing for a TTL, and runs on): the takeover voids its
generation's hold in the same transaction (``void_hold``), so that such a request can
no longer place its hold, and charges nothing if it settles after all; a hold that
changed since it was read (placed, or settled) stops the takeover. Claims and answers
past their 24 hours are pruned by the sweeper, a batch at a time. A request's own writes
to its claim run as the hold's do (``write_transaction``), so that on SQLite they wait for
the write lock without stalling the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import (
    ColumnElement,
    Executable,
    Exists,
    delete,
    exists,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection, Row
from sqlalchemy.exc import IntegrityError

from app.credits.balances import hold_status
from app.credits.expiry import void_hold
from app.credits.models import OPEN
from app.database import lock_until_commit, utcnow, write_transaction
from app.database.partitions import drop_partitions_before
from app.errors import APIError
from app.extensions import db
from app.generations.models import COMPLETED, Generation, IdempotentRequest

REPLAY_WINDOW = timedelta(hours=24)
_CLAIM_COLUMNS = (
    IdempotentRequest.id,
    IdempotentRequest.body_digest,
    IdempotentRequest.response,
    IdempotentRequest.streamed,
    IdempotentRequest.generation_id,
    IdempotentRequest.created_at,
)
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


class IdempotentAnswerLost(APIError):
    """The key's first request was generated and charged, but its answer was not stored."""

    status = 409
    type = "invalid_request_error"
    code = "idempotency_answer_lost"

    def __init__(self, generation: Generation) -> None:
        super().__init__(
            "The request with this Idempotency-Key already ran as generation "
            f"'{generation.id}' and was charged ${generation.cost:f}, but its answer was not "
            "stored: the server running it stopped or failed before it could be (or is "
            "storing it now). It is not run or charged again: GET /v1/generations/"
            f"{generation.id} shows what it used; a new key runs the request anew."
        )
        self.generation_id = generation.id


@dataclass(frozen=True)
class Claim:
    """A claimed key and the generation it runs; ``replay``: the first answer, to repeat."""

    id: int
    generation_id: str | None = None
    replay: bytes | None = None


def check_key(key: str) -> str:
    """Return ``key`` if usable; raise IdempotencyKeyInvalid."""
    if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
        raise IdempotencyKeyInvalid()
    return key


def claim_key(
    *,
    account_id: int,
    key: str,
    body_digest: str,
    claim_ttl_seconds: int,
    new_generation_id: Callable[[], str],
) -> Claim:
    """Claim ``key`` for a generation named by ``new_generation_id()``, or return the replay.

    A claim without an answer, older than ``claim_ttl_seconds``, whose generation holds
    no credit and was never charged, belonged to a request whose worker died before it
    could bill anything: it is taken over.

    :raise IdempotencyKeyReused: the key was used with another body.
    :raise IdempotencyKeyInUse: its request is still running, or was streamed.
    :raise IdempotentAnswerLost: its generation was charged, but its answer was lost.
    """
    generation_id = new_generation_id()

    def claim(connection: Connection) -> int | None:
        # One claim of a key at a time: on PostgreSQL claims are partitioned by month,
        # and no unique index spans the partitions.
        lock_until_commit(connection, f"idempotency-key:{account_id}:{key}")
        this_key = (IdempotentRequest.account_id == account_id, IdempotentRequest.key == key)
        connection.execute(
            delete(IdempotentRequest).where(
                *this_key, IdempotentRequest.created_at < utcnow() - REPLAY_WINDOW
            )
        )
        if connection.execute(select(IdempotentRequest.id).where(*this_key)).first():
            return None
        return connection.execute(
            insert(IdempotentRequest)
            .values(
                account_id=account_id,
                key=key,
                body_digest=body_digest,
                generation_id=generation_id,
                created_at=utcnow(),
            )
            .returning(IdempotentRequest.id)
        ).scalar_one()

    try:
        claimed = write_transaction(claim)
    except IntegrityError:
        claimed = None
    if claimed is not None:
        return Claim(id=claimed, generation_id=generation_id)
    retry = {
        "account_id": account_id,
        "key": key,
        "body_digest": body_digest,
        "claim_ttl_seconds": claim_ttl_seconds,
        "new_generation_id": new_generation_id,
    }
    # The claim's columns, not the object: committing expires an object, and reading it
    # after would cost another round trip.
    first = db.session.execute(
        select(*_CLAIM_COLUMNS).where(
            IdempotentRequest.account_id == account_id, IdempotentRequest.key == key
        )
    ).first()
    db.session.commit()
    if first is None:  # released between our insert and this read: the retry may go on
        return claim_key(**retry)
    if first.body_digest != body_digest:
        raise IdempotencyKeyReused()
    if first.response is not None:
        return Claim(id=first.id, generation_id=first.generation_id, replay=first.response)
    if first.streamed:
        raise IdempotencyKeyInUse(
            "This Idempotency-Key was used for a streamed request, which cannot be replayed."
        )
    seen = _raise_unless_abandoned(first, claim_ttl_seconds)
    _take_over(first, account_id, key, seen)
    return claim_key(**retry)


IN_PROGRESS = "A request with this Idempotency-Key is still in progress. Retry later."


def _raise_unless_abandoned(claim: Row, claim_ttl_seconds: int) -> str | None:
    """Raise unless ``claim``'s request died without charging anything; return its hold's status.

    The hold is read before the record: a settlement closes the one and writes the other
    in one transaction, so a hold found closed has its record (if it has one) readable.

    :raise IdempotencyKeyInUse: its generation still holds credit, or may yet place its hold.
    :raise IdempotentAnswerLost: its generation was charged (or answered).
    """
    seen = hold_status(claim.generation_id) if claim.generation_id is not None else None
    generation = None if seen == OPEN else _charged_generation(claim.generation_id)
    db.session.commit()
    if generation is not None:
        raise IdempotentAnswerLost(generation)
    young = claim.created_at >= utcnow() - timedelta(seconds=claim_ttl_seconds)
    if seen == OPEN or young:
        raise IdempotencyKeyInUse(IN_PROGRESS)
    return seen


def _take_over(claim: Row, account_id: int, key: str, seen: str | None) -> None:
    """Delete an abandoned claim, its generation's hold voided; a concurrent retry may be first.

    :raise IdempotencyKeyInUse: the hold changed since it was ``seen``: the request lives.
    """

    def take_over(connection: Connection) -> None:
        lock_until_commit(connection, f"idempotency-key:{account_id}:{key}")
        if claim.generation_id is not None and not void_hold(
            connection, hold_id=claim.generation_id, account_id=account_id, seen=seen
        ):
            raise IdempotencyKeyInUse(IN_PROGRESS)
        connection.execute(
            delete(IdempotentRequest).where(
                IdempotentRequest.id == claim.id,
                IdempotentRequest.response.is_(None),
                IdempotentRequest.streamed.is_(False),
            )
        )

    write_transaction(take_over)


def _charged_generation(generation_id: str | None) -> Generation | None:
    """Return the generation ``generation_id`` if it was charged or answered, else None.

    A generation that failed without producing anything was recorded at no cost: a retry
    may run it anew.
    """
    if generation_id is None:
        return None
    generation = db.session.get(Generation, generation_id)
    if generation is None or (generation.cost == 0 and generation.status != COMPLETED):
        return None
    return generation


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


def drop_expired_months() -> list[str]:
    """Drop the months of claims all past the replay window, where claims are partitioned."""
    return drop_partitions_before(IdempotentRequest.__tablename__, utcnow() - REPLAY_WINDOW)


def store_answer(claim: Claim, response_body: bytes) -> None:
    """Keep the whole answer of the claim's request, to replay it."""
    _update_claim(claim, response=response_body)


def mark_streamed(claim: Claim) -> None:
    """Record that the claim's answer was streamed, so a retry is refused, not replayed."""
    _update_claim(claim, streamed=True)


def _update_claim(claim: Claim, **values: object) -> None:
    _write(update(IdempotentRequest).where(*_still_ours(claim)).values(**values))


def release_claim(claim: Claim) -> None:
    """Give the key back, so that a retry runs anew: unless its generation was charged.

    Once a settlement charged (or answered) the claim's generation, the claim stays
    bound to it, whatever failed afterwards (storing the answer, on a connection that
    dropped): its retry is told the answer was lost (IdempotentAnswerLost), never run and
    charged again. The generation's record is written with its charge, in one
    transaction, so the release reads the settlement's outcome, not the worker's belief.
    """
    # Whatever the failed request left open in its session goes first: on SQLite a write
    # it began would hold the lock this release waits for.
    db.session.rollback()
    _write(
        delete(IdempotentRequest).where(
            *_still_ours(claim), ~_charged_or_answered(claim.generation_id)
        )
    )


def _charged_or_answered(generation_id: str | None) -> Exists:
    """Return whether the generation ``generation_id`` was recorded charged or answered.

    The same test as ``_charged_generation``: one that failed at no cost may run anew.
    """
    return exists().where(
        Generation.id == generation_id,
        or_(Generation.cost != 0, Generation.status == COMPLETED),
    )


def _still_ours(claim: Claim) -> tuple[ColumnElement[bool], ...]:
    """Return the conditions of ``claim``'s row, if a retry did not take it over.

    A claim taken over is deleted, and SQLite may give its id to the retry's own.
    """
    return (
        IdempotentRequest.id == claim.id,
        IdempotentRequest.generation_id == claim.generation_id,
    )


def _write(statement: Executable) -> None:
    """Run one statement in a transaction of its own, as the hold's writes run."""
    write_transaction(lambda connection: connection.execute(statement))
