"""Idempotency-Key claims end with their request's hold, and stored answers after 24 hours."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import requests
from sqlalchemy import func, select

from app.database import utcnow
from app.extensions import db
from app.generations.models import IdempotentRequest
from app.sweeper import prune_idempotency_records
from tests.contract.conftest import billing_records

BODY = json.dumps({"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hi"}]})


def post(server, key: str, idempotency_key: str) -> requests.Response:
    return requests.post(
        f"{server.url}/v1/chat/completions",
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key,
        },
        data=BODY,
        timeout=30,
    )


def add_claims(app, account_id: int, **ages: timedelta) -> None:
    """Leave unanswered claims, as requests whose worker died would, ``age`` ago."""
    digest = hashlib.sha256(BODY.encode()).hexdigest()
    with app.app_context():
        for key, age in ages.items():
            db.session.add(
                IdempotentRequest(
                    account_id=account_id, key=key, body_digest=digest, created_at=utcnow() - age
                )
            )
        db.session.commit()


def test_a_claim_outlives_its_dead_request_only_as_long_as_a_hold(app, live_server, funded_key):
    ttl = timedelta(seconds=app.config["HOLD_TTL_SECONDS"])
    add_claims(app, funded_key.account_id, abandoned=ttl + timedelta(seconds=5), running=ttl / 2)

    taken_over = post(live_server, funded_key.key, "abandoned")
    replayed = post(live_server, funded_key.key, "abandoned")
    running = post(live_server, funded_key.key, "running")

    assert taken_over.status_code == 200, taken_over.text
    assert replayed.status_code == 200 and replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json() == taken_over.json()
    assert running.status_code == 409
    assert running.json()["error"]["code"] == "idempotency_key_in_use"
    _, generations, charges, _ = billing_records(app, funded_key.account_id)
    assert len(generations) == len(charges) == 1


def count_claims(app, account_id: int) -> int:
    with app.app_context():
        return db.session.scalar(
            select(func.count()).where(IdempotentRequest.account_id == account_id)
        )


def test_the_sweeper_prunes_records_past_24_hours_in_batches(app, live_server, funded_key):
    day = timedelta(hours=24)
    add_claims(
        app, funded_key.account_id, **{f"old{i}": day + timedelta(minutes=i + 1) for i in range(5)}
    )
    add_claims(app, funded_key.account_id, recent=day - timedelta(minutes=1))
    assert post(live_server, funded_key.key, "answered").status_code == 200

    pruned = prune_idempotency_records(app, batch_size=2)

    assert pruned == 5
    assert count_claims(app, funded_key.account_id) == 2
    assert post(live_server, funded_key.key, "answered").headers["Idempotent-Replayed"] == "true"
