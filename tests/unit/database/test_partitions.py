"""Generations and claims partitioned by month (PostgreSQL): the migration, and what it keeps.

The migration of a populated database, and what the primary key on (id, created_at)
still refuses.
"""

from __future__ import annotations

import os
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa
from flask_migrate import downgrade, upgrade
from sqlalchemy.exc import IntegrityError

from app import create_app
from app.database import utcnow
from app.database.partitions import partitions_of
from app.extensions import db
from app.generations.idempotency import IdempotencyKeyInUse, claim_key
from app.generations.models import Generation
from tests.conftest import TEST_CATALOG, _fresh_postgres_database

GENERATIONS = 2_000
COLUMNS = "id, account_id, api_key_id, model, cost, created_at"


@pytest.fixture
def populated():
    """A PostgreSQL database at the revision before partitioning, with a history in it."""
    url = os.environ.get("TEST_DATABASE_URL")
    if not url:
        pytest.skip("the partitioning migration runs on PostgreSQL")
    for database_url in _fresh_postgres_database(url):
        app = create_app(
            "testing", {"SQLALCHEMY_DATABASE_URI": database_url, "MODEL_CATALOG": TEST_CATALOG}
        )
        with app.app_context():
            upgrade(revision="0017")
            fill_history()
            yield app
            db.session.remove()
            db.engine.dispose()


def fill_history() -> None:
    """Two accounts, generations over four months, a key claimed yesterday and today."""
    now = utcnow().replace(tzinfo=None)
    run = db.session.execute
    run(sa.text("INSERT INTO accounts (id, email, balance, reserved, is_admin, created_at) "
                "VALUES (1, 'one@example.com', 0, 0, false, now()), "
                "(2, 'two@example.com', 0, 0, false, now())"))  # fmt: skip
    run(
        sa.text(
            "INSERT INTO generations (id, account_id, api_key_id, model, prompt_tokens, "
            "completion_tokens, cached_tokens, prompt_image_tokens, reasoning_tokens, cost, "
            "status, streamed, estimated, latency_ms, created_at) "
            "SELECT 'old-' || n, 1 + n % 2, NULL, 'dev-chat', 1, 2, 0, 0, 0, n, 'completed', "
            "false, false, 1, CAST(:now AS timestamp) - n * interval '90 minutes' "
            "FROM generate_series(1, :count) AS n"
        ),
        {"now": now, "count": GENERATIONS},
    )
    run(sa.text("INSERT INTO idempotent_requests (account_id, key, body_digest, streamed, "
                "created_at) VALUES (1, 'yesterday', 'd', false, :yesterday), "
                "(1, 'today', 'd', false, :now)"),
        {"yesterday": now - timedelta(days=1), "now": now})  # fmt: skip
    db.session.commit()


def history() -> tuple:
    """A digest of every generation's row; the read ends, so that no lock stays taken."""
    found = db.session.execute(
        sa.text(f"SELECT count(*), sum(cost), min(created_at), max(created_at), "
                f"md5(string_agg({COLUMNS.replace(', ', '::text || ')}::text, ',' ORDER BY id)) "
                "FROM generations")
    ).one()  # fmt: skip
    db.session.commit()
    return found


def test_the_migration_partitions_a_populated_history_and_keeps_every_row(populated):
    before = history()

    upgrade()

    assert history() == before
    with db.engine.connect() as connection:
        months = partitions_of(connection, "generations")
        claims = partitions_of(connection, "idempotent_requests")
    assert months[0].lower is None and months[0].upper > utcnow()
    assert len(months) >= 7 and len(claims) == len(months)
    found = db.session.get(Generation, "old-1")
    assert found is not None and found.cost == Decimal(1) / 10**10
    db.session.commit()


def test_the_partitioned_key_still_refuses_a_second_row_of_a_generation(populated):
    upgrade()
    row = db.session.execute(sa.text(f"SELECT {COLUMNS} FROM generations WHERE id = 'old-7'")).one()
    insert = sa.text(
        "INSERT INTO generations (id, account_id, model, prompt_tokens, completion_tokens, "
        "cached_tokens, prompt_image_tokens, reasoning_tokens, cost, status, streamed, "
        "estimated, latency_ms, created_at) VALUES (:id, 1, 'dev-chat', 0, 0, 0, 0, 0, 0, "
        "'completed', false, false, 0, :created_at)"
    )
    db.session.commit()

    with pytest.raises(IntegrityError):
        db.session.execute(insert, {"id": row.id, "created_at": row.created_at})
    db.session.rollback()
    next_month = utcnow() + timedelta(days=40)
    db.session.execute(insert, {"id": "new-next-month", "created_at": next_month})
    db.session.commit()
    assert db.session.get(Generation, "new-next-month") is not None


def test_a_claimed_key_stays_claimed_across_the_partitions(populated):
    upgrade()

    with pytest.raises(IdempotencyKeyInUse):
        claim_key(
            account_id=1,
            key="today",
            body_digest="d",
            claim_ttl_seconds=900,
            new_generation_id=lambda: "chatcmpl-retry",
        )
    claimed = claim_key(
        account_id=1,
        key="fresh",
        body_digest="d",
        claim_ttl_seconds=900,
        new_generation_id=lambda: "chatcmpl-fresh",
    )
    assert claimed.generation_id == "chatcmpl-fresh"


def test_the_migration_goes_back_to_plain_tables_with_every_row(populated):
    before = history()
    upgrade()

    downgrade(revision="0017")

    assert history() == before
    with db.engine.connect() as connection:
        assert partitions_of(connection, "generations") is None
