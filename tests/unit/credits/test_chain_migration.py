"""Migration 0029 on a ledger the previous release wrote: its entries chained, in order."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal

import pytest
from flask_migrate import upgrade
from sqlalchemy import column, insert, select, table, text

from app import create_app
from app.credits import grants
from app.credits.chain_audit import verify_chains
from app.credits.models import Account, LedgerEntry
from app.database import utcnow
from app.extensions import db
from tests.conftest import TEST_CATALOG, _fresh_postgres_database

ACCOUNTS_AT_0028 = table(
    "accounts",
    column("id"),
    column("name"),
    column("balance"),
    column("reserved"),
    column("created_at"),
)
ENTRIES_AT_0028 = table(
    "ledger_entries",
    column("account_id"),
    column("kind"),
    column("amount"),
    column("generation_id"),
    column("idempotency_key"),
    column("created_at"),
)


@pytest.fixture
def previous_release(database_url: str, tmp_path) -> Iterator:
    """An app on a database of its own, migrated to 0028, the previous release."""
    if database_url.startswith("sqlite"):
        urls: Iterator[str] = iter([f"sqlite:///{tmp_path / 'previous.sqlite3'}"])
    else:
        urls = _fresh_postgres_database(os.environ["TEST_DATABASE_URL"])
    for url in urls:
        app = create_app("testing", {"SQLALCHEMY_DATABASE_URI": url, "MODEL_CATALOG": TEST_CATALOG})
        with app.app_context():
            upgrade(revision="0028")
            yield app
            db.engine.dispose()


def test_the_entries_already_there_are_chained_in_order(previous_release):
    now = utcnow()
    balances = {}
    for account_id in (1, 2):
        entries = [
            (2_000_000 * account_id, None, "grant-|x"),
            (-250_000, f"gen-{account_id}", None),
        ]
        entries += [(-1, f"gen-{account_id}-{n}", None) for n in range(3)]
        balances[account_id] = sum(amount for amount, _, _ in entries)
        db.session.execute(
            insert(ACCOUNTS_AT_0028).values(
                id=account_id,
                name="org",
                balance=balances[account_id],
                reserved=0,
                created_at=now,
            )
        )
        for n, (amount, generation_id, key) in enumerate(entries):
            db.session.execute(
                insert(ENTRIES_AT_0028).values(
                    account_id=account_id,
                    kind="grant" if amount > 0 else "charge",
                    amount=amount,
                    generation_id=generation_id,
                    idempotency_key=key,
                    created_at=now + timedelta(microseconds=n * 1001),
                )
            )
    db.session.commit()

    upgrade()

    report = verify_chains()
    assert (report.accounts, report.problems) == (2, [])
    entries = db.session.query(LedgerEntry).filter_by(account_id=2).order_by(LedgerEntry.id).all()
    assert all(entry.entry_hash for entry in entries)
    assert db.session.get(Account, 2).ledger_head == entries[-1].entry_hash
    db.session.commit()
    # The app's next entry goes on from the head the migration left.
    grants.grant_credits(account_id=2, amount=Decimal("1"))
    assert verify_chains().problems == []


# The previous release's writes, as it sends them: a settlement in one statement that
# debits the account and inserts the charge (in either order), a grant's INSERT and then
# its UPDATE of the balance. It knows nothing of the chain's columns.
SETTLEMENT_DEBIT_FIRST = text(
    "WITH debited AS (UPDATE accounts SET balance = balance - :cost WHERE id = :id "
    "RETURNING id), charged AS (INSERT INTO ledger_entries "
    "(account_id, kind, amount, generation_id, created_at) SELECT id, 'charge', -:cost, "
    ":generation, :now FROM debited RETURNING id) SELECT (SELECT count(*) FROM charged)"
)
SETTLEMENT_ENTRY_FIRST = text(
    "WITH charged AS (INSERT INTO ledger_entries "
    "(account_id, kind, amount, generation_id, created_at) "
    "VALUES (:id, 'charge', -:cost, :generation, :now) RETURNING account_id), "
    "debited AS (UPDATE accounts SET balance = balance - :cost "
    "WHERE id = (SELECT account_id FROM charged) RETURNING id) "
    "SELECT (SELECT count(*) FROM debited)"
)
GRANT = (
    text(
        "INSERT INTO ledger_entries (account_id, kind, amount, idempotency_key, created_at) "
        "VALUES (:id, 'grant', :cost, :generation, :now)"
    ),
    text("UPDATE accounts SET balance = balance + :cost WHERE id = :id"),
)


def write_as_the_previous_release(account_id: int, n: int) -> None:
    """Write the previous release's ``n``-th change to ``account_id``, in a transaction."""
    values = {"id": account_id, "cost": 1_000 + n, "generation": f"old-{account_id}-{n}"}
    values["now"] = utcnow().replace(tzinfo=None)
    statements = ((SETTLEMENT_DEBIT_FIRST,), (SETTLEMENT_ENTRY_FIRST,), GRANT)[n % 3]
    with db.engine.begin() as connection:
        for statement in statements:
            connection.execute(statement, values)


def test_what_the_previous_release_writes_after_the_migration_is_chained(previous_release):
    if db.engine.dialect.name != "postgresql":
        pytest.skip("SQLite is served by one process: the previous release stops first")
    now = utcnow()
    for account_id in (1, 2):
        db.session.execute(
            insert(ACCOUNTS_AT_0028).values(
                id=account_id, name="org", balance=10**12, reserved=0, created_at=now
            )
        )
        db.session.execute(
            insert(ENTRIES_AT_0028).values(
                account_id=account_id, kind="grant", amount=10**12, created_at=now
            )
        )
    db.session.commit()
    upgrade()

    # Both releases at once on both accounts: the previous one from eight threads, the app
    # granting between them.
    def previous_release_writes(thread: int) -> None:
        with previous_release.app_context():
            for n in range(thread, 96, 8):
                write_as_the_previous_release(1 + n % 2, n)

    with ThreadPoolExecutor(max_workers=8) as pool:
        writes = [pool.submit(previous_release_writes, thread) for thread in range(8)]
        for n in range(6):
            grants.grant_credits(account_id=1 + n % 2, amount=Decimal("0.5"))
        for write in writes:
            write.result()

    report = verify_chains()
    assert (report.accounts, report.problems) == (2, [])
    for account_id in (1, 2):
        entries = db.session.scalars(
            select(LedgerEntry).filter_by(account_id=account_id).order_by(LedgerEntry.id)
        ).all()
        account = db.session.get(Account, account_id)
        assert len(entries) == 1 + 48 + 3
        assert account.ledger_head == entries[-1].entry_hash
        assert account.balance == entries[-1].balance_after == sum(e.amount for e in entries)
    db.session.commit()
