"""``flask ledger audit``: re-pricing in SQL, rollups against generations, checkpoints."""

from __future__ import annotations

import random
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import insert, select, text, update

from app.catalog.pricing import Pricing, cost_of
from app.credits.holds import place_hold
from app.credits.models import LedgerEntry, UsageRollup
from app.credits.settlement import Rollup, hour_of, settle_hold
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
        # Of the cache writes, some (or all, or none) with a 1-hour TTL.
        tokens["cache_write_1h_tokens"] = draw.randint(0, tokens["cache_write_tokens"])
        prices = {
            # Up to $1,000 per million tokens: every cost fits the 64 bits money is kept in.
            name: Decimal(draw.randrange(10**13)) / UNITS_PER_USD
            for name in (
                "price_prompt",
                "price_completion",
                "price_cached_read",
                "price_image",
                "price_cache_write",
                "price_cache_write_1h",
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
            prices["price_cache_write_1h"],
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


def settle_billed_lines(account_id, key_id, *, tools_and_tier: bool):
    """Charge a generation with 1-hour cache writes (and tool calls in a tier); return its id.

    Without tools and tier it is re-priced in SQL; with them, in Python.
    """
    usage = Usage(
        prompt_tokens=3000,
        completion_tokens=200,
        cache_write_tokens=2048,
        cache_write_1h_tokens=1024,
        tool_calls={"web_search": 3} if tools_and_tier else None,
    )
    pricing = Pricing(
        Decimal(3),
        Decimal(15),
        Decimal("0.3"),
        Decimal(3),
        Decimal("3.75"),
        Decimal(6),
        tool_calls={"web_search": Decimal("0.01")},
    )
    multiplier = Decimal(2) if tools_and_tier else Decimal(1)
    cost = cost_of(usage, pricing, multiplier)
    generation_id = f"gen-{uuid.uuid4().hex}"
    held = place_hold(
        account_id=account_id, amount=cost, ttl_seconds=60, key_id=key_id, hold_id=generation_id
    )
    created_at = utcnow()
    record = {
        **DEFAULTS,
        "id": generation_id,
        "account_id": account_id,
        "api_key_id": key_id,
        "model": "claude",
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "price_prompt": pricing.prompt,
        "price_completion": pricing.completion,
        "price_cached_read": pricing.cached_read,
        "price_image": pricing.image,
        "price_cache_write": pricing.cache_write,
        "price_cache_write_1h": pricing.cache_write_1h,
        "tool_calls": {"web_search": {"calls": 3, "price": "0.01"}} if tools_and_tier else None,
        "service_tier": "priority" if tools_and_tier else None,
        "tier_multiplier": multiplier,
        "status": "completed",
        "created_at": created_at,
    }
    rollup = Rollup(
        "claude",
        hour_of(created_at),
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
    )
    settle_hold(
        held,
        cost=cost,
        generation_id=generation_id,
        record=(insert(Generation), record),
        rollup=rollup,
    )
    return generation_id


@pytest.mark.parametrize(
    ("tools_and_tier", "planted"),
    [
        # Each line a generation is billed for, recorded otherwise than it was charged.
        (False, {"cache_write_1h_tokens": 0}),
        (False, {"cache_write_1h_tokens": 2048}),
        (False, {"price_cache_write_1h": Decimal("3.75")}),
        (False, {"price_cache_write": Decimal(6)}),
        (True, {"cache_write_1h_tokens": 0}),
        (True, {"price_cache_write_1h": Decimal("3.75")}),
        (True, {"tool_calls": {"web_search": {"calls": 2, "price": "0.01"}}}),
        (True, {"tool_calls": {"web_search": {"calls": 3, "price": "0.001"}}}),
        (True, {"tool_calls": None}),
        (True, {"tier_multiplier": Decimal(1)}),
        (True, {"tier_multiplier": Decimal("1.5")}),
        (False, {"tier_multiplier": Decimal(2)}),
        (False, {"tool_calls": {"web_search": {"calls": 1, "price": "0.01"}}}),
    ],
)
def test_each_billed_line_charged_otherwise_than_recorded_is_caught(
    app, runner, tools_and_tier, planted
):
    with app.app_context():
        account, issued = AccountFactory.with_key()
        account_id = account.id
        generation_id = settle_billed_lines(account.id, issued.id, tools_and_tier=tools_and_tier)
    clean = audit(runner, account_id)
    assert clean.exit_code == 0, clean.output
    assert "checked 1 accounts and 1 generations: 0 mismatches" in clean.output
    with app.app_context():
        tamper(generation_id, **planted)

    caught = audit(runner, account_id)

    assert caught.exit_code == 1, caught.output
    assert f"mismatch: generation {generation_id}: cost $" in caught.output
    assert "but its tokens price at" in caught.output


def test_a_generation_without_tool_calls_is_left_to_the_sql_re_pricing(app_context):
    account, issued = AccountFactory.with_key()
    plain = settle_billed_lines(account.id, issued.id, tools_and_tier=False)
    called = settle_billed_lines(account.id, issued.id, tools_and_tier=True)

    # SQL NULL, not JSON's null: only the generation that called tools is read in Python.
    rows = db.session.execute(
        text("SELECT id FROM generations WHERE account_id = :a AND tool_calls IS NULL"),
        {"a": account.id},
    ).scalars()
    assert list(rows) == [plain] and called != plain
