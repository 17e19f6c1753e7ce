"""``flask ledger audit``: re-pricing in SQL, rollups against generations, checkpoints."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import insert, select, update

from app.catalog.pricing import Pricing, cost_of
from app.credits.ledger import Rollup, hour_of, place_hold, settle_hold
from app.credits.models import LedgerEntry, UsageRollup
from app.database import utcnow
from app.extensions import db
from app.generations import audit as audit_module
from app.generations.audit import priced_in_sql
from app.generations.models import AuditCheckpoint, Generation
from app.money import UNITS_PER_USD
from app.providers.base import Usage
from tests.factories import AccountFactory

DEFAULTS = {
    column.name: column.default.arg
    for column in Generation.__table__.columns
    if column.default is not None and not callable(column.default.arg)
}


def settle_generation(account_id, key_id, created_at, completion_tokens=1000):
    """Charge a generation through the ledger, as a settlement does; return its id.

    $1.5 per million completion tokens, recorded with its rollup at ``created_at``.
    """
    price = Decimal("1.5")
    cost = cost_of(Usage(completion_tokens=completion_tokens), Pricing(0, price, 0, 0))
    generation_id = f"gen-{uuid.uuid4().hex}"
    # A generation's hold takes its id, as the generation core places it.
    held = place_hold(
        account_id=account_id, amount=cost, ttl_seconds=60, key_id=key_id, hold_id=generation_id
    )
    record = {
        **DEFAULTS,
        "id": generation_id,
        "account_id": account_id,
        "api_key_id": key_id,
        "model": "dev-chat",
        "completion_tokens": completion_tokens,
        "price_completion": price,
        "status": "completed",
        "created_at": created_at,
    }
    rollup = Rollup("dev-chat", hour_of(created_at), completion_tokens=completion_tokens)
    settle_hold(
        held,
        cost=cost,
        generation_id=generation_id,
        record=(insert(Generation), record),
        rollup=rollup,
    )
    return generation_id


def audit(runner, account_id, *options):
    return runner.invoke(args=["ledger", "audit", "--account", str(account_id), *options])


def tamper(generation_id, **values):
    db.session.execute(update(Generation).where(Generation.id == generation_id).values(**values))
    db.session.commit()


@pytest.fixture
def audited(app, runner):
    """An account with a generation two days old and one just now, audited clean once."""
    with app.app_context():
        account, issued = AccountFactory.with_key()
        old = settle_generation(account.id, issued.id, utcnow() - timedelta(days=2))
        new = settle_generation(account.id, issued.id, utcnow())
        account_id = account.id
    first = audit(runner, account_id)
    assert first.exit_code == 0, first.output
    assert "checked 1 accounts and 2 generations: 0 mismatches" in first.output
    return account_id, issued.id, old, new


def test_sql_prices_every_usage_exactly_as_cost_of_does(app_context):
    account = AccountFactory.create()
    draw = random.Random(7)
    expected = {}
    for _ in range(300):
        tokens = {
            name: draw.choice((0, 1, draw.randrange(10**3), draw.randrange(2**31)))
            for name in (
                "prompt_tokens",
                "cached_tokens",
                "cache_write_tokens",
                "completion_tokens",
            )
        }
        tokens["prompt_image_tokens"] = draw.randrange(10**4)
        prices = {
            # Up to $1,000 per million tokens: every cost fits the 64 bits money is kept in.
            name: Decimal(draw.randrange(10**13)) / UNITS_PER_USD
            for name in (
                "price_prompt",
                "price_completion",
                "price_cached_read",
                "price_image",
                "price_cache_write",
            )
        }
        generation_id = f"priced-{uuid.uuid4().hex}"
        db.session.execute(
            insert(Generation).values(
                id=generation_id,
                account_id=account.id,
                model="m",
                status="completed",
                **tokens,
                **prices,
            )
        )
        usage = Usage(**{name: tokens[name] for name in tokens})
        pricing = Pricing(
            prices["price_prompt"],
            prices["price_completion"],
            prices["price_cached_read"],
            prices["price_image"],
            prices["price_cache_write"],
        )
        expected[generation_id] = int(cost_of(usage, pricing) * UNITS_PER_USD)
    db.session.commit()

    priced = dict(
        db.session.execute(
            select(Generation.id, priced_in_sql()).where(Generation.account_id == account.id)
        ).all()
    )

    assert priced == expected


def test_an_audit_since_the_checkpoint_checks_only_the_new_rows(app, runner, audited):
    account_id, key_id, _, _ = audited
    with app.app_context():
        settle_generation(account_id, key_id, utcnow())

    again = audit(runner, account_id)

    assert again.exit_code == 0, again.output
    # The one just settled, and the one settled within the hour before the last audit.
    assert "checked 1 accounts and 2 generations: 0 mismatches" in again.output
    assert "checked 1 accounts and 3 generations" in audit(runner, account_id, "--full").output


def test_a_row_tampered_since_the_checkpoint_is_caught(app, runner, audited):
    account_id, key_id, _, _ = audited
    with app.app_context():
        fresh = settle_generation(account_id, key_id, utcnow())
        tamper(fresh, completion_tokens=999)

    caught = audit(runner, account_id)

    assert caught.exit_code == 1
    assert f"mismatch: generation {fresh}: cost $0.0015 but its tokens price at" in caught.output
    assert "completion tokens 2000 but its generations sum to 1999" in caught.output


def test_an_old_tampered_row_is_caught_by_the_full_audit(app, runner, audited):
    account_id, _, old, _ = audited
    with app.app_context():
        tamper(old, cost=Decimal("0.002"))

    since_checkpoint = audit(runner, account_id)
    full = audit(runner, account_id, "--full")

    assert since_checkpoint.exit_code == 0, since_checkpoint.output
    assert full.exit_code == 1
    assert f"generation {old}: cost $0.002 but the ledger charged $0.0015" in full.output
    assert "usage rollup of account" in full.output and "cost $0.0015 but its" in full.output


def test_a_rollup_tampered_in_a_checked_hour_is_caught(app, runner, audited):
    account_id, key_id, _, _ = audited
    with app.app_context():
        db.session.execute(
            update(UsageRollup)
            .where(UsageRollup.account_id == account_id, UsageRollup.hour == hour_of(utcnow()))
            .values(requests=UsageRollup.requests + 1)
        )
        db.session.commit()

    caught = audit(runner, account_id)

    assert caught.exit_code == 1
    assert f"usage rollup of account {account_id}, key {key_id}, model dev-chat" in caught.output
    assert "requests 2 but its generations sum to 1" in caught.output


def test_a_mismatch_keeps_the_checkpoint_until_it_is_mended(app, runner, audited):
    account_id, _, _, new = audited
    with app.app_context():
        checkpoint = db.session.get(AuditCheckpoint, account_id)
        before = (checkpoint.ledger_entry_id, checkpoint.ledger_sum, checkpoint.checked_until)
        db.session.commit()
        tamper(new, cost=Decimal("0.5"))

    assert audit(runner, account_id).exit_code == 1
    with app.app_context():
        checkpoint = db.session.get(AuditCheckpoint, account_id)
        assert (checkpoint.ledger_entry_id, checkpoint.ledger_sum) == before[:2]
        assert checkpoint.checked_until == before[2]
        db.session.commit()
        tamper(new, cost=Decimal("0.0015"))
    assert audit(runner, account_id).exit_code == 0


def test_the_checkpoint_sums_the_ledger_written_an_hour_before_the_audit(
    app, runner, audited, monkeypatch
):
    account_id, _, _, _ = audited
    with app.app_context():
        checkpoint = db.session.get(AuditCheckpoint, account_id)
        # Every entry is younger than an hour: none is in the checkpoint yet.
        assert (checkpoint.ledger_entry_id, checkpoint.ledger_sum) == (0, 0)
        db.session.commit()
    later = utcnow() + timedelta(hours=2)
    monkeypatch.setattr(audit_module, "utcnow", lambda: later)

    assert audit(runner, account_id).exit_code == 0
    with app.app_context():
        checkpoint = db.session.get(AuditCheckpoint, account_id)
        entries = db.session.scalars(
            select(LedgerEntry.id).where(LedgerEntry.account_id == account_id)
        ).all()
        assert checkpoint.ledger_sum == Decimal("10") - 2 * Decimal("0.0015")
        assert checkpoint.ledger_entry_id == max(entries) and len(entries) == 3
        assert checkpoint.checked_until == later - timedelta(hours=1)
        db.session.commit()
