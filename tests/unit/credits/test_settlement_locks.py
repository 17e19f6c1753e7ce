"""A settlement step by step frees its account's row before it waits for the disk."""

from __future__ import annotations

from decimal import Decimal

import pytest
import sqlalchemy

from app.credits import holds, settlement
from app.database.connections import DURABLE_STATEMENTS
from app.money import MONEY_QUANTUM
from tests.factories import AccountFactory


@pytest.fixture
def postgres_only(database_url: str) -> str:
    if not database_url.startswith("postgresql"):
        pytest.skip("row locks and WAL flushes are PostgreSQL's")
    return database_url


def test_a_settlement_beyond_its_hold_waits_for_the_disk_with_the_account_free(
    app_context, postgres_only, monkeypatch
):
    account = AccountFactory.create(credits=Decimal("1"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.1"), ttl_seconds=60)
    durable = app_context.extensions[DURABLE_STATEMENTS]
    seen_while_waiting = []
    outside = sqlalchemy.create_engine(postgres_only, isolation_level="AUTOCOMMIT")
    original_wait = durable.wait_for_disk

    def wait_for_disk():
        # Another request's lock on the account, taken while the settlement waits: it
        # must not have to wait for the settlement, whose charge is already committed.
        with outside.connect() as connection:
            seen_while_waiting.append(
                connection.execute(
                    sqlalchemy.text(
                        "SELECT balance FROM accounts WHERE id = :id FOR UPDATE NOWAIT"
                    ),
                    {"id": account.id},
                ).scalar_one()
            )
        original_wait()

    monkeypatch.setattr(durable, "wait_for_disk", wait_for_disk)
    try:
        charged = settlement.settle_hold(held, cost=Decimal("0.3"), generation_id="g-unlocked")
    finally:
        outside.dispose()
    assert charged == Decimal("0.3")
    # The charge was committed before the wait: the balance read (stored as a count of
    # MONEY_QUANTUM) is already 0.7.
    assert seen_while_waiting == [Decimal("0.7") / MONEY_QUANTUM]
