"""SIGTERM: gunicorn stops accepting, lets streams in flight finish, and each settles once."""

from __future__ import annotations

import signal
import time
from decimal import Decimal

import requests

from tests.conftest import running_server
from tests.contract.conftest import billing_records, open_slow_stream


def refused_within(url: str, seconds: float) -> bool:
    """Whether new connections are refused within ``seconds`` (workers notice each second)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            requests.get(f"{url}/healthz", headers={"Connection": "close"}, timeout=1)
        except requests.ConnectionError:
            return True
        time.sleep(0.1)
    return False


def test_sigterm_lets_a_stream_in_flight_finish_and_settle_once(
    app, database_url, tmp_path, make_funded_key
):
    funded = make_funded_key(Decimal("5"))
    with running_server(database_url, tmp_path) as server:
        stream = open_slow_stream(server.url, funded.key, words=80)
        events = stream.iter_lines()
        first = next(line for line in events if line)

        server.process.send_signal(signal.SIGTERM)
        refused_while_streaming = refused_within(server.url, seconds=3)
        rest = [line for line in events if line]
        stream.close()  # an idle keep-alive connection would hold the worker to its grace
        exit_status = server.process.wait(timeout=30)

    assert refused_while_streaming
    assert first.startswith(b"data: {")
    assert rest[-1] == b"data: [DONE]"
    assert not any(b'"error"' in line for line in rest)
    assert exit_status == 0
    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    assert (generation.status, generation.streamed) == ("completed", True)
    assert generation.completion_tokens >= 80
    assert charge.amount == -generation.cost and charge.generation_id == generation.id
    assert [hold.status for hold in holds] == ["settled"]
    assert account.reserved == 0 and account.balance == Decimal("5") - generation.cost
