"""Requests waiting for the database stall no other request; their writes commit together."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from decimal import Decimal

import pytest
import requests
from sqlalchemy.engine import make_url

from tests.conftest import running_server
from tests.contract.conftest import billing_records
from tests.contract.test_metrics import TOKEN, samples, value

HELLO = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}
WAITING_REQUESTS = 3


@contextmanager
def completions_behind_the_lock(
    database_url: str, url: str, headers: list[dict[str, str]]
) -> Iterator[tuple[list[Future], Callable[[], None]]]:
    """Send a completion per ``headers`` while another process holds SQLite's write lock.

    Yields their futures, once they have had time to queue for the lock, and the function
    that releases it.
    """
    # Another process (another worker, the operator's CLI) is writing.
    writer = sqlite3.connect(make_url(database_url).database, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    with ThreadPoolExecutor(len(headers)) as pool:
        completions = [
            pool.submit(
                requests.post, f"{url}/v1/chat/completions", json=HELLO, headers=each, timeout=60
            )
            for each in headers
        ]
        time.sleep(1)  # time for them to reach their writes, and wait for the lock
        try:
            yield completions, lambda: writer.execute("ROLLBACK")
        finally:
            if writer.in_transaction:
                writer.execute("ROLLBACK")


def test_requests_waiting_for_sqlites_write_lock_leave_their_worker_serving(
    database_url, tmp_path, make_funded_key
):
    if not database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL locks rows, and its waits yield to the worker already")
    funded = make_funded_key()
    headers = {"Authorization": f"Bearer {funded.key}"}
    # One claims an Idempotency-Key first, a write of its own; the others hold.
    each = [{**headers, "Idempotency-Key": "waits-0"}] + [headers] * (WAITING_REQUESTS - 1)
    with (
        running_server(database_url, tmp_path) as server,
        completions_behind_the_lock(database_url, server.url, each) as (completions, release),
    ):
        # SQLite's own wait would sleep the whole worker until the writer is done.
        models = requests.get(f"{server.url}/v1/models", headers=headers, timeout=5)
        waiting = [not completion.done() for completion in completions]
        release()
        answers = [completion.result() for completion in completions]

    assert models.status_code == 200
    assert all(waiting), "the completions could not have been held while the lock was taken"
    assert [answer.status_code for answer in answers] == [200] * WAITING_REQUESTS


def test_requests_that_waited_for_the_lock_commit_their_holds_together(
    app, database_url, tmp_path, make_funded_key
):
    if not database_url.startswith("sqlite"):
        pytest.skip("only SQLite's writers queue for one lock")
    funded = make_funded_key(Decimal("5"))
    each = [{"Authorization": f"Bearer {funded.key}"}] * WAITING_REQUESTS
    with running_server(database_url, tmp_path, METRICS_TOKEN=TOKEN) as server:
        with completions_behind_the_lock(database_url, server.url, each) as (completions, release):
            release()
            answers = [completion.result() for completion in completions]
        found = samples(server)

    assert [answer.status_code for answer in answers] == [200] * WAITING_REQUESTS
    # The holds queued while the lock was taken: one commit carried them all.
    assert value(found, "gateway_sqlite_shared_commit_writes_count") >= 1
    assert value(found, "gateway_sqlite_shared_commit_writes_sum") >= WAITING_REQUESTS
    # Each was charged once, as if it had committed alone.
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert len(generations) == len(charges) == len(holds) == WAITING_REQUESTS
    assert {hold.status for hold in holds} == {"settled"}
    assert account.reserved == 0
    assert account.balance == Decimal("5") - sum(generation.cost for generation in generations)
