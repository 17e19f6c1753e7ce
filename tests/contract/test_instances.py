"""Two gateway instances (two gunicorn masters) on one PostgreSQL and one Redis.

The per-key rate limit holds across both, and requests racing through both never
overdraw an account or charge a generation twice. PostgreSQL only: SQLite is one
machine's file, not a database two instances share.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from decimal import Decimal
from itertools import cycle

import pytest
import requests
from sqlalchemy import select

from app.completions.models import Generation
from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from tests.conftest import running_server
from tests.contract.test_concurrency import ask

REDIS_URL = "redis://127.0.0.1:6379/0"
BALANCE = Decimal("0.0006")


@pytest.fixture
def two_instances(database_url, tmp_path):
    """Start two instances with ``start(**env)``; both are stopped after the test."""
    if not database_url.startswith("postgresql"):
        pytest.skip("several instances share a PostgreSQL database (TEST_DATABASE_URL)")
    with ExitStack() as stack:

        def start(**env: str) -> list[str]:
            return [
                stack.enter_context(
                    running_server(
                        database_url, tmp_path, REDIS_URL=REDIS_URL, WEB_CONCURRENCY="2", **env
                    )
                ).url
                for _ in range(2)
            ]

        yield start


def test_the_rate_limit_holds_across_instances(two_instances, make_funded_key):
    urls = two_instances(RATE_LIMIT="5 per minute")
    funded = make_funded_key()

    statuses = [
        requests.get(
            f"{url}/v1/models",
            headers={"Authorization": f"Bearer {funded.key}", "Connection": "close"},
            timeout=30,
        ).status_code
        for url, _ in zip(cycle(urls), range(12), strict=False)
    ]

    assert statuses.count(200) == 5 and statuses.count(429) == 7


def test_racing_requests_through_both_never_overdraw(app, runner, two_instances, make_funded_key):
    urls = two_instances()
    funded = make_funded_key(BALANCE)

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: ask(urls[i % 2], funded.key, i), range(200)))

    assert {status for status, _, _ in results} <= {200, 402}
    answered = {gid: cost for status, gid, cost in results if status == 200}
    assert 10 < len(answered) < 200, "the balance must run out during the race"
    with app.app_context():
        account = db.session.get(Account, funded.account_id)
        charges = dict(
            db.session.execute(
                select(LedgerEntry.generation_id, LedgerEntry.amount).where(
                    LedgerEntry.account_id == funded.account_id, LedgerEntry.kind == "charge"
                )
            ).all()
        )
        generations = db.session.scalars(
            select(Generation.id).where(Generation.account_id == funded.account_id)
        ).all()
        open_holds = db.session.scalars(
            select(Hold.id).where(Hold.account_id == funded.account_id, Hold.status == "open")
        ).all()
    assert account.balance >= 0 and account.reserved == 0 and open_holds == []
    assert BALANCE - account.balance == sum(answered.values())
    assert set(generations) == set(answered) == set(charges)
    assert all(charges[gid] == -cost for gid, cost in answered.items())
    assert runner.invoke(args=["ledger", "audit"]).exit_code == 0
