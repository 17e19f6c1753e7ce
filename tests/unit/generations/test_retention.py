"""GENERATION_RETENTION_DAYS: raw generations pruned; the ledger, the rollups and the young kept."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from app import sweeper
from app.credits.models import LedgerEntry, UsageRollup
from app.database import utcnow
from app.database.partitions import add_month_partitions, month_after, partitions_of
from app.extensions import db
from app.generations import retention
from app.generations.models import Generation, GenerationRetention
from app.generations.rollups import rebuild_rollups
from tests.factories import AccountFactory
from tests.unit.generations.test_audit import settle_generation

DAY = timedelta(days=1)


def snapshot(account_ids):
    """The accounts' ledger entries, rollups and generation ids, as the database has them."""
    entries = db.session.execute(
        select(LedgerEntry.id, LedgerEntry.amount, LedgerEntry.created_at)
        .where(LedgerEntry.account_id.in_(account_ids))
        .order_by(LedgerEntry.id)
    ).all()
    rollups = db.session.execute(
        select(UsageRollup.__table__).where(UsageRollup.account_id.in_(account_ids))
    ).all()
    generations = set(
        db.session.scalars(select(Generation.id).where(Generation.account_id.in_(account_ids)))
    )
    db.session.commit()
    return entries, sorted(rollups), generations


def generations_aged(account_id, key_id, ages):
    """Settle a generation of each age; return their ids by age."""
    now = utcnow()
    return {age: settle_generation(account_id, key_id, now - age) for age in ages}


def test_pruning_deletes_only_what_is_older_than_the_retention(disposable_app):
    with disposable_app.app_context():
        retained = 3 * DAY
        accounts = [AccountFactory.with_key() for _ in range(2)]
        ages = (40 * DAY, retained + timedelta(minutes=2), retained - timedelta(minutes=2), DAY)
        made = [generations_aged(a.id, k.id, ages) for a, k in accounts]
        ids = [account.id for account, _ in accounts]
        entries, rollups, _ = snapshot(ids)

        pruned = retention.prune_generations(older_than=retained, batch_size=1)

        after_entries, after_rollups, kept = snapshot(ids)
        assert pruned == 4
        assert kept == {by_age[age] for by_age in made for age in ages[2:]}
        assert (after_entries, after_rollups) == (entries, rollups)
        mark = db.session.get(GenerationRetention, retention.RETENTION_ROW)
        assert utcnow() - retained - timedelta(minutes=1) < mark.pruned_before < utcnow() - retained
        assert mark.swept_before == mark.pruned_before


def test_a_second_pruning_looks_only_at_the_hours_since_the_first(disposable_app):
    with disposable_app.app_context():
        account, issued = AccountFactory.with_key()
        generations_aged(account.id, issued.id, (10 * DAY, 2 * DAY))
        assert retention.prune_generations(older_than=5 * DAY) == 1
        swept = db.session.get(GenerationRetention, retention.RETENTION_ROW).swept_before
        db.session.commit()

        assert retention.prune_generations(older_than=DAY) == 1
        after = db.session.get(GenerationRetention, retention.RETENTION_ROW)
        assert after.swept_before > swept
        db.session.commit()


def test_rollups_of_pruned_hours_stay_and_the_rebuild_leaves_them(disposable_app):
    with disposable_app.app_context():
        account, issued = AccountFactory.with_key()
        generations_aged(account.id, issued.id, (10 * DAY, 9 * DAY, DAY))
        before = snapshot([account.id])[1]
        retention.prune_generations(older_than=5 * DAY)

        report = rebuild_rollups(account_id=account.id)

        assert snapshot([account.id])[1] == before
        assert report.generations == 1
        assert report.first_hour > utcnow() - 5 * DAY


def test_the_sweeper_prunes_only_when_a_retention_is_set(disposable_app):
    with disposable_app.app_context():
        account, issued = AccountFactory.with_key()
        old = generations_aged(account.id, issued.id, (10 * DAY,))[10 * DAY]

    disposable_app.config["GENERATION_RETENTION_DAYS"] = None
    assert sweeper.keep_history(disposable_app) == 0
    disposable_app.config["GENERATION_RETENTION_DAYS"] = 7
    assert sweeper.keep_history(disposable_app) == 1
    with disposable_app.app_context():
        assert db.session.get(Generation, old) is None
        db.session.commit()


def test_pruning_drops_the_months_wholly_past_the_retention(disposable_app, monkeypatch):
    later = utcnow() + 300 * DAY
    with disposable_app.app_context():
        if db.engine.dialect.name != "postgresql":
            pytest.skip("generations are partitioned by month on PostgreSQL")
        account, issued = AccountFactory.with_key()
        add_month_partitions("generations", since=utcnow(), through=later)
        monkeypatch.setattr(retention, "utcnow", lambda: later)
        now_made = generations_aged(account.id, issued.id, (DAY,))[DAY]
        younger = settle_generation(account.id, issued.id, later - 10 * DAY)
        older = settle_generation(account.id, issued.id, later - 40 * DAY)
        entries = snapshot([account.id])[0]
        with db.engine.connect() as connection:
            before = partitions_of(connection, "generations")

        pruned = retention.prune_generations(older_than=30 * DAY)

        with db.engine.connect() as connection:
            after = partitions_of(connection, "generations")
        cutoff = later - 30 * DAY
        assert [p for p in before if p.upper <= cutoff] and all(p.upper > cutoff for p in after)
        assert after == [p for p in before if p.upper > cutoff]
        assert snapshot([account.id])[2] == {younger}
        # The older one is deleted as a row only if its month straddles the cutoff.
        assert pruned == (0 if month_after(later - 40 * DAY) <= cutoff else 1)
        assert now_made not in snapshot([account.id])[2] and older not in snapshot([account.id])[2]
        assert snapshot([account.id])[0] == entries
