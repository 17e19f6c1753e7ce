"""Raw generations kept for GENERATION_RETENTION_DAYS; the ledger and the rollups forever.

Pruning first says how far it goes (``GenerationRetention.pruned_before``), then drops
the months wholly older than that where the table is partitioned (PostgreSQL), then
deletes what is left, one account at a time, a small batch per transaction: every batch
is a short write of its own, so requests' writes never wait behind a long one. The
accounts with generations to prune are found from their rollups' hours, and only from
those since the last pruning that finished (``swept_before``). A generation younger
than the retention is never deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select, update
from sqlalchemy.engine import Connection

from app.credits.models import UsageRollup
from app.credits.settlement import hour_of
from app.database import utcnow, write_transaction
from app.database.partitions import add_month_partitions, drop_partitions_before
from app.extensions import db
from app.generations.models import Generation, GenerationRetention, IdempotentRequest

log = logging.getLogger(__name__)

RETENTION_ROW = 1
# Generations deleted per transaction.
PRUNE_BATCH_SIZE = 500
# How far ahead the partitioned tables have their months: a row whose month has no
# partition would be refused, so they are there long before they are needed.
PARTITIONS_AHEAD = timedelta(days=183)
PARTITIONED = (Generation.__tablename__, IdempotentRequest.__tablename__)


def first_kept_hour() -> datetime | None:
    """Return the first UTC hour whose generations are all kept; None: none was ever pruned."""
    pruned_before = db.session.scalar(
        select(GenerationRetention.pruned_before).where(GenerationRetention.id == RETENTION_ROW)
    )
    db.session.commit()
    if pruned_before is None:
        return None
    start = hour_of(pruned_before)
    return start if start == pruned_before else start + timedelta(hours=1)


def prune_generations(
    *,
    older_than: timedelta,
    batch_size: int = PRUNE_BATCH_SIZE,
    pause: Callable[[], None] = lambda: time.sleep(0),
) -> int:
    """Delete the generations recorded more than ``older_than`` ago; return how many rows.

    Rows in dropped partitions are not counted. ``pause`` runs between batches (by
    default it lets the worker's requests run).
    """
    cutoff = utcnow() - older_than
    swept_before = write_transaction(lambda connection: _mark_pruned(connection, cutoff))
    dropped = drop_partitions_before(Generation.__tablename__, cutoff)
    if dropped:
        log.info("dropped the generations of %s", ", ".join(dropped))
    pruned = 0
    for account_id in _accounts_with_generations_before(cutoff, swept_before):
        pruned += _prune_account(account_id, cutoff, batch_size, pause)
    write_transaction(lambda connection: _mark_swept(connection, cutoff))
    return pruned


def _mark_pruned(connection: Connection, cutoff: datetime) -> datetime | None:
    """Say that generations before ``cutoff`` may be gone; return where the last pruning ended."""
    _raise_mark(connection, "pruned_before", cutoff)
    row = GenerationRetention.__table__.c
    return connection.execute(
        select(row.swept_before).where(row.id == RETENTION_ROW)
    ).scalar_one_or_none()


def _mark_swept(connection: Connection, cutoff: datetime) -> None:
    _raise_mark(connection, "swept_before", cutoff)


def _raise_mark(connection: Connection, name: str, cutoff: datetime) -> None:
    """Move the mark ``name`` to ``cutoff``, never back: prunings may overlap."""
    mark = GenerationRetention.__table__.c[name]
    connection.execute(
        update(GenerationRetention.__table__)
        .where(GenerationRetention.id == RETENTION_ROW, or_(mark.is_(None), mark < cutoff))
        .values({mark: cutoff})
    )


def _accounts_with_generations_before(cutoff: datetime, swept_before: datetime | None) -> list[int]:
    """Return the accounts with rollups (so generations) in the hours before ``cutoff``.

    Only the hours since the last pruning that finished: every generation before
    ``swept_before`` is gone already.
    """
    query = select(UsageRollup.account_id).where(UsageRollup.hour < cutoff).distinct()
    if swept_before is not None:
        query = query.where(UsageRollup.hour >= hour_of(swept_before))
    account_ids = list(db.session.scalars(query))
    db.session.commit()
    return account_ids


def _prune_account(
    account_id: int, cutoff: datetime, batch_size: int, pause: Callable[[], None]
) -> int:
    older = (Generation.account_id == account_id, Generation.created_at < cutoff)
    oldest = select(Generation.id).where(*older).order_by(Generation.created_at).limit(batch_size)
    batch = delete(Generation).where(*older, Generation.id.in_(oldest.scalar_subquery()))
    pruned = 0
    while True:
        deleted = write_transaction(lambda connection: connection.execute(batch).rowcount)
        pruned += deleted
        if deleted < batch_size:
            return pruned
        pause()


def add_partitions_ahead() -> list[str]:
    """Give the partitioned tables their months from now's to PARTITIONS_AHEAD from now."""
    now = utcnow()
    return [
        name
        for table in PARTITIONED
        for name in add_month_partitions(table, since=now, through=now + PARTITIONS_AHEAD)
    ]
