"""Keep running requests' holds alive, release dead workers' holds, prune old idempotency keys.

Each gunicorn worker runs one sweeper greenlet. It renews the holds of every request
the worker is running (``live_holds``), whatever the request is doing: waiting for an
upstream through retries, generating a whole answer, or writing to a caller who stopped
reading; one UPDATE for all of them, every ``sweep_interval``. A dead worker renews
nothing, so its holds expire after HOLD_TTL_SECONDS, and releasing an expired hold from
any worker is safe; the conditional UPDATE in ``ledger.release_expired_holds`` makes
concurrent sweepers release each hold once.
"""

from __future__ import annotations

import logging
import time
import weakref

from flask import Flask
from sqlalchemy.exc import SQLAlchemyError

from app.completions.idempotency import prune_expired_claims
from app.credits.ledger import extend_holds, release_expired_holds
from app.extensions import db

log = logging.getLogger(__name__)


class LiveHolds:
    """The open holds of the requests this worker process is running.

    A hold is tracked with the object of the request that owns it, by weak reference: a
    request that ends without settling (its response was never read) stops its hold's
    renewal when it is garbage, and the hold then expires as a dead worker's would.
    """

    def __init__(self) -> None:
        self._owners: dict[str, weakref.ref] = {}

    def track(self, hold_id: str, owner: object) -> None:
        """Renew ``hold_id`` while ``owner`` lives, until ``forget``."""
        self._owners[hold_id] = weakref.ref(owner)

    def forget(self, hold_id: str) -> None:
        """Stop renewing ``hold_id`` (its request settled)."""
        self._owners.pop(hold_id, None)

    def hold_ids(self) -> list[str]:
        """Return the holds to renew, dropping those whose request is gone."""
        for hold_id, owner in list(self._owners.items()):
            if owner() is None:
                self._owners.pop(hold_id, None)
        return list(self._owners)


live_holds = LiveHolds()


def renew_live_holds(app: Flask, holds: LiveHolds = live_holds) -> int:
    """Push the expiry of the running requests' holds forward; return how many."""
    hold_ids = holds.hold_ids()
    if not hold_ids:
        return 0
    with app.app_context():
        try:
            return extend_holds(hold_ids, ttl_seconds=app.config["HOLD_TTL_SECONDS"])
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("renewing the holds of running requests failed; will retry")
            return 0


def sweep_interval(hold_ttl_seconds: int) -> float:
    """Seconds between sweeps: a fraction of the TTL, so a hold outlives it by little.

    Live holds are renewed as often, so they stay at least half a TTL from expiring.
    """
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
    """Renew live holds and sweep expired ones forever; meant to run in its own greenlet."""
    interval = sweep_interval(app.config["HOLD_TTL_SECONDS"])
    while True:
        time.sleep(interval)
        renew_live_holds(app)
        sweep_expired_holds(app)
        prune_idempotency_records(app)
