"""Credits a caller can trust: their balance, idempotent retries, and cut-off streams."""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
import requests
from sqlalchemy import select

from app.credits.models import Account
from app.extensions import db
from app.generations.models import Generation
from tests.contract.conftest import billing_records as records
from tests.contract.conftest import open_slow_stream

HELLO = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}


def post(live_server, key, body, **headers):
    return requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", **headers},
        json=body,
        timeout=30,
    )


def test_credits_endpoint_shows_granted_used_and_remaining(live_server, funded_key):
    cost = Decimal(
        str(post(live_server, funded_key.key, HELLO).json()["usage"]["cost"]["total_cost"])
    )
    response = requests.get(
        f"{live_server.url}/v1/credits", headers={"Authorization": f"Bearer {funded_key.key}"}
    )
    data = json.loads(response.content, parse_float=Decimal)["data"]
    assert data == {"total_credits": 10, "total_usage": cost, "remaining": 10 - cost}


def test_credits_endpoint_needs_a_key(live_server):
    assert requests.get(f"{live_server.url}/v1/credits").status_code == 401


def test_a_retry_with_the_same_idempotency_key_is_answered_once(app, live_server, funded_key):
    first = post(live_server, funded_key.key, HELLO, **{"Idempotency-Key": "retry-1"})
    second = post(live_server, funded_key.key, HELLO, **{"Idempotency-Key": "retry-1"})
    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    _, generations, charges, _ = records(app, funded_key.account_id)
    assert len(generations) == 1 and len(charges) == 1


def test_the_same_idempotency_key_with_another_body_is_400(live_server, funded_key):
    post(live_server, funded_key.key, HELLO, **{"Idempotency-Key": "retry-2"})
    other = dict(HELLO, messages=[{"role": "user", "content": "something else"}])
    response = post(live_server, funded_key.key, other, **{"Idempotency-Key": "retry-2"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "idempotency_key_reused"


def test_a_failed_request_gives_its_idempotency_key_back(live_server, make_funded_key):
    broke = make_funded_key(Decimal(0))
    assert post(live_server, broke.key, HELLO, **{"Idempotency-Key": "k"}).status_code == 402
    assert post(live_server, broke.key, HELLO, **{"Idempotency-Key": "k"}).status_code == 402


def test_a_streamed_request_is_not_replayed_nor_charged_twice(app, live_server, funded_key):
    body = dict(HELLO, stream=True)
    first = post(live_server, funded_key.key, body, **{"Idempotency-Key": "stream-1"})
    assert first.text.endswith("data: [DONE]\n\n")
    again = post(live_server, funded_key.key, body, **{"Idempotency-Key": "stream-1"})
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "idempotency_key_in_use"
    _, generations, _, _ = records(app, funded_key.account_id)
    assert len(generations) == 1


def assert_settled_once(app, account_id, start=Decimal("10")):
    account, generations, charges, holds = records(app, account_id)
    assert len(generations) == 1 and len(charges) == 1
    generation = generations[0]
    assert charges[0].amount == -generation.cost and generation.cost > 0
    assert account.balance == start - generation.cost and account.reserved == 0
    assert [hold.status for hold in holds] == ["settled"]
    return generation


def test_a_stream_cut_by_the_upstream_is_settled_for_what_was_delivered(
    app, live_server, funded_key
):
    response = post(
        live_server,
        funded_key.key,
        {
            "model": "dev-dying",
            "messages": [{"role": "user", "content": "one two three four five six seven"}],
            "stream": True,
        },
    )
    events = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "upstream_error"
    delivered = [json.loads(e) for e in events[:-2]]
    tokens = [c["choices"][0]["delta"].get("content") for c in delivered]
    assert len([t for t in tokens if t]) == 5
    generation = assert_settled_once(app, funded_key.account_id)
    assert generation.status == "failed" and generation.estimated
    assert generation.completion_tokens == 5


def test_a_stream_cut_by_the_caller_is_settled_once_for_what_was_produced(
    app, live_server, funded_key
):
    with open_slow_stream(live_server.url, funded_key.key, words=200) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(12)]
    received = [line for line in received if line.startswith(b"data: ")]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not records(app, funded_key.account_id)[1]:
        time.sleep(0.1)
    generation = assert_settled_once(app, funded_key.account_id)
    assert generation.status == "cancelled" and generation.streamed
    # Billed for the tokens produced before the server saw the caller leave: the ones
    # delivered, plus at most the few already in flight, and never the 200 asked for.
    assert len(received) - 1 <= generation.completion_tokens <= len(received) + 3


def test_ledger_audit_passes_and_catches_tampering(app, runner, live_server, funded_key):
    post(live_server, funded_key.key, HELLO)
    clean = runner.invoke(args=["ledger", "audit", "--account", str(funded_key.account_id)])
    assert clean.exit_code == 0, clean.output
    assert " 0 mismatches" in clean.output
    with app.app_context():
        account = db.session.get(Account, funded_key.account_id)
        account.balance += Decimal("0.01")
        db.session.commit()
    try:
        tampered = runner.invoke(args=["ledger", "audit", "--account", str(funded_key.account_id)])
        assert tampered.exit_code == 1
        assert f"account {funded_key.account_id}: balance" in tampered.output
    finally:
        with app.app_context():
            account = db.session.get(Account, funded_key.account_id)
            account.balance -= Decimal("0.01")
            db.session.commit()


@pytest.mark.parametrize("field", ["cost", "completion_tokens"])
def test_ledger_audit_reprices_every_generation(app, runner, live_server, funded_key, field):
    post(live_server, funded_key.key, HELLO)
    with app.app_context():
        generation = db.session.scalar(
            select(Generation).where(Generation.account_id == funded_key.account_id)
        )
        generation_id, original = generation.id, getattr(generation, field)
        setattr(generation, field, original + 1)
        db.session.commit()
    try:
        result = runner.invoke(args=["ledger", "audit", "--account", str(funded_key.account_id)])
        assert result.exit_code == 1
        assert f"generation {generation_id}" in result.output
    finally:
        with app.app_context():
            generation = db.session.get(Generation, generation_id)
            setattr(generation, field, original)
            db.session.commit()
