"""Keep running requests' holds alive and their streams' progress recorded; end dead ones.

Each gunicorn worker runs three loops beside its requests, each a greenlet of its own, so
that none waits behind another's work:

- ``run_renewals``, for the worker's own requests: about once a second it records what
  each of its streams delivered since the last time (one UPDATE for all of them), so
  that a stream is billed even if the worker dies; every ``sweep_interval`` it renews
  the holds of every request the worker is running (``live_holds``), whatever the
  request is doing: waiting for an upstream through retries, generating a whole
  answer, or writing to a caller who stopped reading; one UPDATE for all of them.
- ``run_sweeper``, for everyone's: every ``sweep_interval`` it ends expired holds. A
  dead worker renews nothing, so its holds expire after HOLD_TTL_SECONDS, and ending
  an expired hold from any worker is safe: a hold whose stream recorded progress is
  settled at it, any other is released; the conditional UPDATEs of the ledger end each
  hold once, and a hold another worker's sweeper ended first is left to it. Each sweep
  also prunes what has outlived its time: Idempotency-Key records past their 24 hours,
  stored Responses API responses past RESPONSES_TTL_DAYS, password links and pending
  sign-ups past their time (a sign-up keeps a password's hash), and generations past
  GENERATION_RETENTION_DAYS, a small batch per transaction; and on PostgreSQL it adds
  the coming months' partitions and drops the expired ones.
- ``run_alert_deliverer``: every ALERTS_POLL_SECONDS it sends the alert events the
  ledger wrote (app.alerts.delivery), so that a slow webhook never delays the sweeps.

A loop never ends: a duty that fails is logged and runs again at its next turn
(``run_duties``). A worker whose renewals stopped would let the holds of the requests it
is still running expire, and its streams' progress go unrecorded.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from flask import Flask
from sqlalchemy.exc import SQLAlchemyError

from app.accounts.links import prune_expired_links
from app.alerts.delivery import deliver_alerts
from app.credits.errors import AlreadyRecorded
from app.credits.expiry import (
    expired_holds_with_progress,
    extend_holds,
    record_progress,
    release_expired_holds,
)
from app.extensions import db
from app.generations.idempotency import drop_expired_months, prune_expired_claims
from app.generations.lifecycle import progress_of, settle_interrupted
from app.generations.live import LiveHolds, live_holds
from app.generations.retention import add_partitions_ahead, prune_generations
from app.observability.trace import close_trace, open_trace
from app.payments.topups import top_up_where_due
from app.responses.store import prune_expired_responses

log = logging.getLogger(__name__)


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


def record_stream_progress(app: Flask, holds: LiveHolds = live_holds) -> int:
    """Record what each running stream delivered since last time; return how many."""
    progress = [
        (hold_id, recorded)
        for hold_id, generation in holds.owners()
        if (recorded := progress_of(generation)) is not None
    ]
    if not progress:
        return 0
    with app.app_context():
        try:
            record_progress(progress)
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("recording the progress of running streams failed; will retry")
            return 0
    return len(progress)


def sweep_expired_holds(app: Flask) -> int:
    """End expired holds once: settle those with progress, release the others; return how many."""
    with app.app_context():
        try:
            settled = _settle_interrupted_streams()
            released = release_expired_holds()
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("ending expired holds failed; will retry")
            return 0
    if released:
        log.info("released %d expired holds", released)
    return settled + released


def _settle_interrupted_streams() -> int:
    """Settle the expired holds of streams whose worker died, at their recorded progress."""
    settled = 0
    for hold, progress in expired_holds_with_progress():
        # Its log lines carry the request's id, as the stream's own would have.
        trace = open_trace(progress.get("request_id") or hold.id)
        try:
            charge = settle_interrupted(hold, progress)
        except AlreadyRecorded:
            # Another worker's sweeper read it too, and settled it first.
            continue
        finally:
            close_trace(trace)
        log.warning(
            "generation %s: its worker stopped while it streamed; charged $%s for what "
            "it had delivered, as last recorded",
            hold.id,
            charge,
        )
        settled += 1
    return settled


def keep_history(app: Flask) -> int:
    """Add the partitioned tables' months ahead; prune generations past their retention.

    Return how many generations were deleted (a dropped month's are not counted).
    """
    days = app.config["GENERATION_RETENTION_DAYS"]
    with app.app_context():
        try:
            add_partitions_ahead()
            if days is None:
                return 0
            pruned = prune_generations(older_than=timedelta(days=days))
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("keeping the history's partitions and retention failed; will retry")
            return 0
    if pruned:
        log.info("pruned %d generations older than %d days", pruned, days)
    return pruned


# Deleted per statement, so that pruning a day's backlog never holds long locks.
PRUNE_BATCH_SIZE = 500


def prune_in_batches(app: Flask, prune: Callable[..., int], what: str, batch_size: int) -> int:
    """Run ``prune(batch_size=...)`` until a batch comes back short; return how many went.

    A failed batch is rolled back and logged; the next sweep goes on where it stopped.
    """
    pruned = 0
    with app.app_context():
        try:
            batch = batch_size
            while batch == batch_size:
                batch = prune(batch_size=batch_size)
                pruned += batch
                time.sleep(0)  # let the worker's requests run between batches
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("pruning %s failed; will retry", what)
    if pruned:
        log.info("pruned %d %s", pruned, what)
    return pruned


def prune_idempotency_records(app: Flask, batch_size: int = PRUNE_BATCH_SIZE) -> int:
    """Delete Idempotency-Key records past their 24 hours, in batches; return how many."""
    pruned = prune_in_batches(app, prune_expired_claims, "expired idempotency records", batch_size)
    with app.app_context():
        try:
            drop_expired_months()
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("dropping expired months of idempotency records failed; will retry")
    return pruned


def prune_stored_responses(app: Flask, batch_size: int = PRUNE_BATCH_SIZE) -> int:
    """Delete stored responses past RESPONSES_TTL_DAYS, in batches; return how many."""
    return prune_in_batches(app, prune_expired_responses, "expired stored responses", batch_size)


def prune_password_links(app: Flask, batch_size: int = PRUNE_BATCH_SIZE) -> int:
    """Delete password links and pending sign-ups past their time; return how many."""
    return prune_in_batches(app, prune_expired_links, "expired links and sign-ups", batch_size)


def make_due_topups(app: Flask) -> int:
    """Pay the auto top-ups of the organisations below their threshold; return how many."""
    with app.app_context():
        try:
            return top_up_where_due()
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("auto top-ups failed; will retry")
            return 0


Duty = Callable[[Flask], object]


def run_duties(app: Flask, duties: Sequence[Duty]) -> None:
    """Run each of ``duties``; log what one raises unexpectedly, and go on with the next.

    Each duty handles the database's failures itself; anything else it raises must not
    end the loop that runs it, the only one of its kind in the worker.
    """
    for duty in duties:
        try:
            duty(app)
        except Exception:
            log.exception("%s failed unexpectedly; it runs again at its next turn", duty.__name__)


def run_renewals(app: Flask) -> None:
    """Record the streams' progress every tick, renew the holds every sweep; forever."""
    tick = app.config["STREAM_PROGRESS_SECONDS"]
    ticks_per_sweep = max(1, round(sweep_interval(app.config["HOLD_TTL_SECONDS"]) / tick))
    for ticks in itertools.count(1):
        time.sleep(tick)
        if ticks % ticks_per_sweep:
            run_duties(app, (record_stream_progress,))
        else:
            run_duties(app, (record_stream_progress, renew_live_holds))


SWEEPS: tuple[Duty, ...] = (
    sweep_expired_holds,
    prune_idempotency_records,
    prune_stored_responses,
    prune_password_links,
    keep_history,
    make_due_topups,
)


def run_sweeper(app: Flask) -> None:
    """End expired holds and prune what outlived its time, every sweep; forever."""
    interval = sweep_interval(app.config["HOLD_TTL_SECONDS"])
    while True:
        time.sleep(interval)
        run_duties(app, SWEEPS)


def deliver_pending_alerts(app: Flask) -> int:
    """Send the alert events that are due; return how many deliveries succeeded."""
    with app.app_context():
        try:
            return deliver_alerts()
        except SQLAlchemyError:
            db.session.rollback()
            log.exception("delivering alerts failed; will retry")
            return 0


def run_alert_deliverer(app: Flask) -> None:
    """Deliver alert events every ALERTS_POLL_SECONDS; in a greenlet, forever."""
    while True:
        time.sleep(app.config["ALERTS_POLL_SECONDS"])
        run_duties(app, (deliver_pending_alerts,))
