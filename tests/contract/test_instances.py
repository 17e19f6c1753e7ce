"""Two gateway instances (two gunicorn masters) on one PostgreSQL and one Redis.

The per-key rate limit holds across both, and requests racing through both never
overdraw an account or charge a generation twice. PostgreSQL only: SQLite is one
machine's file, not a database two instances share.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from itertools import cycle

import pytest
import requests

from tests.conftest import running_server
from tests.contract.test_concurrency import BALANCE, ask, assert_the_race_left_exact_books

REDIS_URL = "redis://127.0.0.1:6379/0"


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

    assert_the_race_left_exact_books(app, runner, funded, results, sent=200)
