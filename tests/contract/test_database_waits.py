"""A request waiting for the database stalls no other request of its worker."""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from sqlalchemy.engine import make_url

from tests.conftest import running_server

HELLO = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}
WAITING_REQUESTS = 3


def test_requests_waiting_for_sqlites_write_lock_leave_their_worker_serving(
    database_url, tmp_path, make_funded_key
):
    if not database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL locks rows, and its waits yield to the worker already")
    funded = make_funded_key()
    headers = {"Authorization": f"Bearer {funded.key}"}
    with running_server(database_url, tmp_path) as server:
        # Another process (another worker, the operator's CLI) is writing.
        writer = sqlite3.connect(make_url(database_url).database, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
        with ThreadPoolExecutor(WAITING_REQUESTS) as pool:
            # One claims an Idempotency-Key first, a write of its own; the others hold.
            completions = [
                pool.submit(
                    requests.post,
                    f"{server.url}/v1/chat/completions",
                    json=HELLO,
                    headers={**headers, "Idempotency-Key": "waits-0"} if index == 0 else headers,
                    timeout=60,
                )
                for index in range(WAITING_REQUESTS)
            ]
            time.sleep(1)  # time for them to reach their hold, and wait for the lock

            # SQLite's own wait would sleep the whole worker until the writer is done.
            models = requests.get(f"{server.url}/v1/models", headers=headers, timeout=5)
            waiting = [not completion.done() for completion in completions]
            writer.execute("ROLLBACK")
            answers = [completion.result() for completion in completions]

    assert models.status_code == 200
    assert all(waiting), "the completions could not have been held while the lock was taken"
    assert [answer.status_code for answer in answers] == [200] * WAITING_REQUESTS
