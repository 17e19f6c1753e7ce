"""The ledger's hash chain: written by every path that adds an entry, and tampering found."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest
from sqlalchemy import select, text

from app.cli import register
from app.credits import grants, holds, settlement
from app.credits.chain import GENESIS, ChainedFields
from app.credits.chain_audit import fields_of, verify_chains
from app.credits.models import Account, LedgerEntry
from app.database import sha256_hex, utcnow, write_transaction
from app.extensions import db
from tests.factories import AccountFactory


def entries_of(account_id):
    db.session.expire_all()
    rows = db.session.scalars(
        select(LedgerEntry).where(LedgerEntry.account_id == account_id).order_by(LedgerEntry.id)
    ).all()
    db.session.commit()
    return rows


def settle(account_id, cost, hold_amount, generation_id):
    held = holds.place_hold(account_id=account_id, amount=hold_amount, ttl_seconds=60)
    return settlement.settle_hold(held, cost=cost, generation_id=generation_id)


def every_kind_of_entry(account_id):
    """Write an entry by each path: grants, a payment's grant and take-back, charges."""
    grants.grant_credits(account_id=account_id, amount=Decimal("5"), idempotency_key="a|b")
    write_transaction(
        lambda connection: grants.grant_within(
            connection,
            account_id=account_id,
            amount=Decimal("2"),
            idempotency_key="code:1",
            description="paid",
        )
    )
    write_transaction(
        lambda connection: grants.take_back_within(
            connection,
            account_id=account_id,
            amount=Decimal("1"),
            idempotency_key="refund:1",
            description="refund",
        )
    )
    # Within its hold (one statement on PostgreSQL), beyond it (steps), and nothing.
    settle(account_id, Decimal("0.25"), Decimal("1"), "gen-within")
    settle(account_id, Decimal("1.5"), Decimal("1"), "gen-beyond")
    settle(account_id, Decimal("0"), Decimal("1"), "gen-free")


def test_sql_and_python_compute_the_same_digest(app_context):
    fields = ChainedFields(
        entry_id=7,
        account_id=3,
        kind="grant",
        amount=Decimal("-1.5"),
        balance_after=Decimal("2"),
        generation_id=None,
        reference="é|1",
        created_at=utcnow(),
        previous_hash=GENESIS,
    )
    assert db.session.scalar(select(sha256_hex(fields.text()))) == fields.digest()
    assert "|-|3:é|1|" in fields.text()


def test_every_path_chains_its_entry(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    every_kind_of_entry(account.id)
    entries = entries_of(account.id)
    assert [entry.kind for entry in entries] == ["grant"] * 3 + ["take_back"] + ["charge"] * 2
    previous, balance = GENESIS, Decimal(0)
    for entry in entries:
        balance += entry.amount
        assert entry.previous_hash == previous and entry.balance_after == balance
        assert entry.entry_hash == fields_of(entry).digest()
        previous = entry.entry_hash
    db.session.expire_all()
    account = db.session.get(Account, account.id)
    assert (account.ledger_head, account.balance) == (previous, balance)
    assert verify_chains([account.id]).problems == []


@pytest.fixture
def tamperable(disposable_app):
    """An account of six entries on a database of its own, its ledger open to UPDATE and DELETE."""
    with disposable_app.app_context():
        account = AccountFactory.create(credits=Decimal("1"))
        every_kind_of_entry(account.id)
        ids = [entry.id for entry in entries_of(account.id)]
        if db.engine.dialect.name == "postgresql":
            db.session.execute(text("ALTER TABLE ledger_entries DISABLE TRIGGER USER"))
        else:
            db.session.execute(text("DROP TRIGGER ledger_entries_no_update"))
            db.session.execute(text("DROP TRIGGER ledger_entries_no_delete"))
        db.session.commit()
        yield disposable_app, account.id, ids


def tamper(statement, **parameters):
    db.session.execute(text(statement), parameters)
    db.session.commit()


def verify_cli(app, account_id):
    register_once(app)
    return app.test_cli_runner().invoke(args=["ledger", "verify", "--account", str(account_id)])


def register_once(app):
    if "ledger" not in app.cli.commands:
        register(app)


def test_an_untouched_ledger_verifies(tamperable):
    app, account_id, _ = tamperable
    result = verify_cli(app, account_id)
    assert result.exit_code == 0, result.output
    assert "1 accounts: 0 broken" in result.output


def test_an_amount_changed_is_found(tamperable):
    app, account_id, ids = tamperable
    with app.app_context():
        tamper("UPDATE ledger_entries SET amount = amount - 1 WHERE id = :id", id=ids[4])
    result = verify_cli(app, account_id)
    assert result.exit_code == 1
    assert f"account {account_id}, entry {ids[4]}: it differs" in result.output


def test_an_entry_deleted_is_found(tamperable):
    app, account_id, ids = tamperable
    with app.app_context():
        tamper("DELETE FROM ledger_entries WHERE id = :id", id=ids[2])
    result = verify_cli(app, account_id)
    assert result.exit_code == 1
    assert f"entry {ids[3]}: the entry it was chained after is missing" in result.output


def test_two_entries_swapped_are_found(tamperable):
    app, account_id, ids = tamperable
    first, second = ids[1], ids[2]
    with app.app_context():
        tamper("UPDATE ledger_entries SET id = -1 WHERE id = :id", id=first)
        tamper("UPDATE ledger_entries SET id = :to WHERE id = :id", to=first, id=second)
        tamper("UPDATE ledger_entries SET id = :to WHERE id = -1", to=second)
    result = verify_cli(app, account_id)
    assert result.exit_code == 1
    assert f"entry {first}: it differs" in result.output


def test_an_entry_moved_after_its_successor_is_out_of_order(tamperable):
    app, account_id, ids = tamperable
    with app.app_context():
        # Its own digest still holds: only where it stands gives it away.
        tamper("UPDATE ledger_entries SET id = 1000000 WHERE id = :id", id=ids[1])
        report = verify_chains([account_id])
    assert [str(problem) for problem in report.problems] == [
        f"account {account_id}, entry {ids[2]}: it is out of order: "
        "it was chained after entry 1000000, which comes after it"
    ]


def test_the_tail_cut_is_found(tamperable):
    app, account_id, ids = tamperable
    with app.app_context():
        tamper("DELETE FROM ledger_entries WHERE id = :id", id=ids[-1])
    result = verify_cli(app, account_id)
    assert result.exit_code == 1
    assert f"entries after entry {ids[-2]} are missing" in result.output


def test_a_balance_changed_without_an_entry_is_found(tamperable):
    app, account_id, _ = tamperable
    with app.app_context():
        tamper("UPDATE accounts SET balance = balance + 100000 WHERE id = :id", id=account_id)
    result = verify_cli(app, account_id)
    assert result.exit_code == 1
    assert f"account {account_id}, its row: its balance is" in result.output
    assert "changed without an entry" in result.output


def test_the_ledger_still_refuses_changes_to_a_chained_entry(app_context):
    account = AccountFactory.create(credits=Decimal("1"))
    with pytest.raises(Exception, match="append-only"):
        db.session.execute(
            text("UPDATE ledger_entries SET entry_hash = NULL WHERE account_id = :id"),
            {"id": account.id},
        )
    db.session.rollback()


def test_the_audit_verifies_the_chain_too(tamperable):
    app, account_id, ids = tamperable
    register_once(app)
    runner = app.test_cli_runner()
    audit = ["ledger", "audit", "--account", str(account_id)]
    assert runner.invoke(args=audit).exit_code == 0
    with app.app_context():
        # Nothing but the chain covers an entry's time.
        tamper(
            "UPDATE ledger_entries SET created_at = :at WHERE id = :id",
            at=datetime(2020, 1, 1),
            id=ids[3],
        )
    result = runner.invoke(args=audit)
    assert result.exit_code == 1
    assert f"mismatch: chain of account {account_id}, entry {ids[3]}: it differs" in result.output
