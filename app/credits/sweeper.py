"""Release the holds of requests whose worker died, and prune old idempotency records.

Each gunicorn worker runs one sweeper greenlet. A hold expires only when its request
stopped renewing it, so releasing it from any worker is safe; the conditional UPDATE in
``ledger.release_expired_holds`` makes concurrent sweepers release each hold once.
"""

from __future__ import annotations

import logging
import time

from flask import Flask
from sqlalchemy.exc import SQLAlchemyError

from app.completions.idempotency import prune_expired_claims
from app.credits.ledger import release_expired_holds
from app.extensions import db

log = logging.getLogger(__name__)


def sweep_interval(hold_ttl_seconds: int) -> float:
    """Seconds between sweeps: a fraction of the TTL, so a hold outlives it by little."""
    return max(1.0, min(60.0, hold_ttl_seconds / 4))


def sweep_expired_holds(app: Flask) -> int:
    """Release expired holds once; return how many were released."""
    with app.app_context():
        try:
            released = release_expired_holds()
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("releasing expired holds failed; will retry")
            return 0
    if released:
        log.info("released %d expired holds", released)
    return released


# Deleted per statement, so that pruning a day's backlog never holds long locks.
PRUNE_BATCH_SIZE = 500


def prune_idempotency_records(app: Flask, batch_size: int = PRUNE_BATCH_SIZE) -> int:
    """Delete Idempotency-Key records past their 24 hours, in batches; return how many."""
    pruned = 0
    with app.app_context():
        try:
            batch = batch_size
            while batch == batch_size:
                batch = prune_expired_claims(batch_size=batch_size)
                pruned += batch
                time.sleep(0)  # let the worker's requests run between batches
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("pruning idempotency records failed; will retry")
    if pruned:
        log.info("pruned %d expired idempotency records", pruned)
    return pruned


def run_sweeper(app: Flask) -> None:
    """Sweep forever, every ``sweep_interval``; meant to run in its own greenlet."""
    interval = sweep_interval(app.config["HOLD_TTL_SECONDS"])
    while True:
        time.sleep(interval)
        sweep_expired_holds(app)
        prune_idempotency_records(app)
