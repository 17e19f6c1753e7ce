"""``flask usage rebuild``: rollups recomputed from the raw generations, exactly, idempotently."""

from __future__ import annotations

import uuid
from datetime import timedelta
from decimal import Decimal

from sqlalchemy import delete, insert, select, update

from app.credits.models import NO_KEY, UsageRollup
from app.credits.settlement import hour_of
from app.database import utcnow
from app.extensions import db
from app.generations.models import Generation, GenerationRetention
from app.generations.retention import RETENTION_ROW
from app.generations.rollups import rebuild_rollups, rollup_mismatches
from tests.factories import AccountFactory

SUMS = ("requests", "prompt_tokens", "completion_tokens", "reasoning_tokens", "cost", "shortfall")


def import_generation(account_id, key_id, model, created_at, cost="0.001", shortfall="0"):
    """Write a generation's row as an import would: no settlement, no rollup."""
    db.session.execute(
        insert(Generation).values(
            id=f"imported-{uuid.uuid4().hex}",
            account_id=account_id,
            api_key_id=key_id,
            model=model,
            prompt_tokens=10,
            completion_tokens=20,
            reasoning_tokens=5,
            cost=Decimal(cost),
            shortfall=Decimal(shortfall),
            status="completed",
            created_at=created_at,
        )
    )
    db.session.commit()


def rollups_of(account_id):
    rows = db.session.scalars(select(UsageRollup).where(UsageRollup.account_id == account_id))
    found = {(r.api_key_id, r.model, r.hour): tuple(getattr(r, n) for n in SUMS) for r in rows}
    db.session.commit()
    return found


def imported_history(account_id, key_id):
    """Generations over three days, two models, a key and none; return their first hour."""
    now = utcnow()
    for days in range(3):
        for minutes in (1, 2, 61):
            moment = now - timedelta(days=days, minutes=minutes)
            import_generation(account_id, key_id, "dev-chat", moment)
            import_generation(account_id, None, "dev-chat-mini", moment, shortfall="0.0005")
    return hour_of(now - timedelta(days=2, minutes=61))


def test_a_rebuild_makes_the_rollups_the_sums_of_the_generations(app_context):
    account, issued = AccountFactory.with_key()
    imported_history(account.id, issued.id)
    assert rollups_of(account.id) == {}

    report = rebuild_rollups(account_id=account.id)

    rolled = rollups_of(account.id)
    assert report.accounts == 1 and report.generations == 18 and report.rollups == len(rolled)
    assert sum(sums[0] for sums in rolled.values()) == 18
    assert sum(sums[5] for key, sums in rolled.items() if key[0] == NO_KEY) == Decimal("0.0045")
    assert list(rollup_mismatches([account.id], None)) == []


def test_a_rebuild_run_twice_changes_nothing_and_mends_a_broken_rollup(app_context):
    account, issued = AccountFactory.with_key()
    imported_history(account.id, issued.id)
    rebuild_rollups(account_id=account.id)
    first = rollups_of(account.id)
    db.session.execute(
        update(UsageRollup)
        .where(UsageRollup.account_id == account.id, UsageRollup.api_key_id == issued.id)
        .values(requests=UsageRollup.requests + 7, cost=UsageRollup.cost + Decimal("1"))
    )
    db.session.execute(
        insert(UsageRollup).values(
            account_id=account.id,
            api_key_id=NO_KEY,
            model="ghost",
            hour=hour_of(utcnow()),
            requests=1,
        )
    )
    db.session.commit()
    assert len(list(rollup_mismatches([account.id], None))) == len(first) // 2 + 1

    rebuild_rollups(account_id=account.id)
    rebuild_rollups(account_id=account.id)

    assert rollups_of(account.id) == first
    assert list(rollup_mismatches([account.id], None)) == []


def test_a_rebuild_of_one_account_leaves_the_others_alone(app_context):
    mine, my_key = AccountFactory.with_key()
    theirs, their_key = AccountFactory.with_key()
    imported_history(mine.id, my_key.id)
    imported_history(theirs.id, their_key.id)

    rebuild_rollups(account_id=mine.id)

    assert rollups_of(mine.id) and rollups_of(theirs.id) == {}


def test_a_rebuild_recomputes_only_the_hours_whose_generations_are_all_kept(app_context):
    account, issued = AccountFactory.with_key()
    first_hour = imported_history(account.id, issued.id)
    rebuild_rollups(account_id=account.id)
    pruned_before = utcnow() - timedelta(days=1, hours=12)
    db.session.execute(
        update(GenerationRetention)
        .where(GenerationRetention.id == RETENTION_ROW)
        .values(pruned_before=pruned_before)
    )
    # The oldest generations pruned, as the sweeper would have.
    db.session.execute(
        delete(Generation).where(
            Generation.account_id == account.id, Generation.created_at < pruned_before
        )
    )
    db.session.commit()
    try:
        report = rebuild_rollups(account_id=account.id)
        rolled = rollups_of(account.id)
    finally:
        db.session.execute(
            update(GenerationRetention)
            .where(GenerationRetention.id == RETENTION_ROW)
            .values(pruned_before=None)
        )
        db.session.commit()

    assert report.first_hour == hour_of(pruned_before) + timedelta(hours=1)
    assert report.generations == 12
    assert any(hour == first_hour for _, _, hour in rolled), "the pruned day's rollups stay"
    assert sum(sums[0] for sums in rolled.values()) == 18


def test_the_command_rebuilds_and_refuses_an_unknown_account(app, runner):
    with app.app_context():
        account, issued = AccountFactory.with_key()
        account_id = account.id
        imported_history(account_id, issued.id)

    rebuilt = runner.invoke(args=["usage", "rebuild", "--account", str(account_id)])
    unknown = runner.invoke(args=["usage", "rebuild", "--account", "999999999"])

    assert rebuilt.exit_code == 0, rebuilt.output
    assert "of 1 accounts from 18 generations" in rebuilt.output
    assert unknown.exit_code == 1 and unknown.output.strip().splitlines() == [
        "Error: no account with id 999999999"
    ]
