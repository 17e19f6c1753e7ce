"""A running request keeps its hold however long it runs, and settles whatever its key does."""

from __future__ import annotations

import threading
import time
from decimal import Decimal

import pytest
import requests
from sqlalchemy import delete, select

from app.accounts import keys
from app.auth.models import ApiKey
from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import running_server
from tests.upstream_server import ReplayServer, Reply

CATALOG = """
[upstreams.own]
kind = "openai"
base_url = "{url}/own/v1"
retries = 1

[[models]]
id = "slow-model"
max_output_tokens = 512
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [{{ upstream = "own", model = "Qwen/Qwen3-8B" }}]
"""
HOLD_TTL_SECONDS = 2
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def upstream():
    server = ReplayServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    """Gunicorn with a short hold TTL, so that a hold nobody renews expires mid-request."""
    folder = tmp_path_factory.mktemp("running")
    catalog = folder / "models.toml"
    catalog.write_text(CATALOG.format(url=upstream.url))
    with running_server(
        database_url, folder, catalog=str(catalog), HOLD_TTL_SECONDS=str(HOLD_TTL_SECONDS)
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def scripted(upstream):
    upstream.reset()
    yield upstream
    assert upstream.unused_replies() == {}


def in_background(gateway, key, body) -> tuple[threading.Thread, dict]:
    """Send the request from a thread; its response lands in the returned dict."""
    outcome: dict = {}

    def send() -> None:
        outcome["response"] = requests.post(
            f"{gateway.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json=body,
            timeout=60,
        )

    thread = threading.Thread(target=send)
    thread.start()
    return thread, outcome


def holds_and_reserved(app, account_id) -> tuple[list[str], Decimal]:
    with app.app_context():
        db.session.expire_all()
        statuses = db.session.scalars(select(Hold.status).where(Hold.account_id == account_id))
        reserved = db.session.get(Account, account_id).reserved
        return list(statuses), reserved


def charges_of(app, account_id) -> tuple[Decimal, list[Generation]]:
    with app.app_context():
        db.session.expire_all()
        balance = db.session.get(Account, account_id).balance
        generations = db.session.scalars(
            select(Generation).where(Generation.account_id == account_id)
        ).all()
        charged = db.session.execute(
            select(LedgerEntry.generation_id, LedgerEntry.amount).where(
                LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge"
            )
        ).all()
        assert {generation: -amount for generation, amount in charged} == {
            g.id: g.cost for g in generations
        }
        return balance, generations


@pytest.mark.parametrize(
    ("replies", "stream"),
    [
        # A whole answer the upstream takes seconds to write.
        ([Reply("openai_chat", pause=2.5)], False),
        # A stream whose first byte waits for a slow failure and a retry.
        ([Reply("openai_error_500", pause=3), Reply("openai_chat_stream", pause=0.2)], True),
    ],
    ids=["slow-whole-answer", "stream-waiting-for-its-first-byte"],
)
def test_a_running_request_keeps_its_hold_past_the_ttl(
    app, gateway, scripted, make_funded_key, replies, stream
):
    scripted.script("/own", *replies)
    funded = make_funded_key(Decimal("1"))
    body = {"model": "slow-model", "messages": HELLO, "stream": stream}
    thread, outcome = in_background(gateway, funded.key, body)
    time.sleep(HOLD_TTL_SECONDS * 1.5 + 0.5)
    statuses, reserved = holds_and_reserved(app, funded.account_id)
    assert thread.is_alive(), "the request must still be running"
    assert statuses == ["open"] and reserved > 0
    thread.join()
    assert outcome["response"].status_code == 200, outcome["response"].text
    statuses, reserved = holds_and_reserved(app, funded.account_id)
    assert statuses == ["settled"] and reserved == 0
    balance, (generation,) = charges_of(app, funded.account_id)
    assert generation.cost > 0 and balance == Decimal("1") - generation.cost


def revoke(key_id: int) -> None:
    keys.revoke_key(key_id)


def rotate(key_id: int) -> None:
    keys.rotate_key(key_id)


def remove_row(key_id: int) -> None:
    db.session.execute(delete(ApiKey).where(ApiKey.id == key_id))
    db.session.commit()


@pytest.mark.parametrize(
    ("action", "status_after", "keeps_key"),
    [
        (keys.delete_key, 401, True),
        (revoke, 403, True),
        (rotate, 401, True),
        (remove_row, 401, False),
    ],
    ids=["deleted", "revoked", "rotated", "row-removed"],
)
def test_a_request_running_when_its_key_changes_is_still_charged(
    app, gateway, scripted, make_funded_key, runner, action, status_after, keeps_key
):
    scripted.script("/own", Reply("openai_chat", pause=0.8))
    funded = make_funded_key(Decimal("1"))
    body = {"model": "slow-model", "messages": HELLO}
    thread, outcome = in_background(gateway, funded.key, body)
    time.sleep(0.5)
    with app.app_context():
        action(funded.key_id)
    thread.join()
    assert outcome["response"].status_code == 200, outcome["response"].text
    balance, (generation,) = charges_of(app, funded.account_id)
    assert generation.cost > 0 and balance == Decimal("1") - generation.cost
    assert generation.api_key_id == (funded.key_id if keeps_key else None)
    assert holds_and_reserved(app, funded.account_id) == (["settled"], 0)
    again = requests.post(
        f"{gateway.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded.key}"},
        json=body,
        timeout=30,
    )
    assert again.status_code == status_after
    audit = runner.invoke(args=["ledger", "audit", "--account", str(funded.account_id)])
    assert audit.exit_code == 0, audit.output


def test_a_limit_set_while_a_request_runs_counts_its_hold_and_charge(
    app, gateway, scripted, make_funded_key
):
    scripted.script("/own", Reply("openai_chat", pause=0.8))
    funded = make_funded_key(Decimal("1"))
    body = {"model": "slow-model", "messages": HELLO}
    thread, outcome = in_background(gateway, funded.key, body)
    time.sleep(0.5)
    # Below the running request's hold (512 completion tokens at $0.40/M), above the next's.
    limit = Decimal("0.0001")
    with app.app_context():
        keys.update_key_limits(funded.key_id, permitted_models=None, monthly_limit=limit)
    refused = requests.post(
        f"{gateway.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={**body, "max_tokens": 1},
        timeout=30,
    )
    assert refused.status_code == 402, refused.text
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert "the key has $0 left this month" in refused.json()["error"]["message"]
    thread.join()
    assert outcome["response"].status_code == 200, outcome["response"].text
    _, (generation,) = charges_of(app, funded.account_id)
    with app.app_context():
        key = db.session.get(ApiKey, funded.key_id)
        db.session.refresh(key)
        assert (key.window_spent, key.window_reserved) == (generation.cost, 0)
