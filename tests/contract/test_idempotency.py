"""Idempotency-Key claims end with their request's hold, and stored answers after 24 hours.

A claim whose request was charged stays bound to it, whatever fails after the charge.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import pytest
import requests
from sqlalchemy import func, select, text

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


# The two stores of an answer, after its charge: the answer kept with its claim (every
# door), and the Responses door's stored response (``store`` is true by default).
ANSWER_STORES = {"idempotent_requests": "response", "stored_responses": "response"}


@contextmanager
def failing_answer_stores(app, account_id: int) -> Iterator[None]:
    """Make the database refuse to store the account's answers, as a dropped connection does.

    A trigger on each store, for this account only, dropped afterwards.
    """
    postgres = db_backend(app) == "postgresql"
    with app.app_context():
        if postgres:
            db.session.execute(text(FAIL_FUNCTION))
        for table, column in ANSWER_STORES.items():
            for trigger in failing_triggers(table, column, account_id, postgres):
                db.session.execute(text(trigger))
        db.session.commit()
    try:
        yield
    finally:
        with app.app_context():
            for table in ANSWER_STORES:
                if postgres:
                    db.session.execute(text(f"DROP TRIGGER fail_store_{table} ON {table}"))
                else:
                    for event in EVENTS:
                        db.session.execute(text(f"DROP TRIGGER fail_store_{table}_{event}"))
            db.session.commit()


FAIL_FUNCTION = """
CREATE OR REPLACE FUNCTION fail_answer_store() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'the connection dropped while storing the answer'; END $$
"""


EVENTS = ("insert", "update")


def failing_triggers(table: str, column: str, account_id: int, postgres: bool) -> list[str]:
    """Return the CREATE TRIGGERs that fail a write of ``column`` of the account's rows."""
    when = f"NEW.{column} IS NOT NULL AND NEW.account_id = {int(account_id)}"
    if postgres:
        return [
            f"CREATE TRIGGER fail_store_{table} BEFORE INSERT OR UPDATE ON {table} "
            f"FOR EACH ROW WHEN ({when}) EXECUTE FUNCTION fail_answer_store()"
        ]
    return [
        f"CREATE TRIGGER fail_store_{table}_{event} BEFORE {event} ON {table} "
        f"WHEN {when} BEGIN SELECT RAISE(ABORT, 'the answer could not be stored'); END"
        for event in EVENTS
    ]


def db_backend(app) -> str:
    with app.app_context():
        return db.engine.dialect.name


HI = {"role": "user", "content": "hi"}
DOORS = {
    "chat": ("/v1/chat/completions", {"model": "dev-chat-mini", "messages": [HI]}),
    "messages": ("/v1/messages", {"model": "dev-chat-mini", "max_tokens": 20, "messages": [HI]}),
    "responses": ("/v1/responses", {"model": "dev-chat-mini", "input": "hi"}),
}


@pytest.mark.parametrize("door", DOORS)
def test_an_answer_that_cannot_be_stored_after_its_charge_is_never_charged_again(
    app, live_server, funded_key, door
):
    path, body = DOORS[door]
    headers = {"Authorization": f"Bearer {funded_key.key}", "Idempotency-Key": f"lost-{door}"}

    def send() -> requests.Response:
        return requests.post(f"{live_server.url}{path}", headers=headers, json=body, timeout=30)

    with failing_answer_stores(app, funded_key.account_id):
        first = send()
        retries = [send() for _ in range(2)]
    after = send()

    assert first.status_code == 500
    _, generations, charges, _ = billing_records(app, funded_key.account_id)
    (generation,) = generations
    assert [charge.generation_id for charge in charges] == [generation.id]
    assert generation.cost > 0 and charges[0].amount == -generation.cost
    for retry in [*retries, after]:
        assert retry.status_code == 409, retry.text
        error = retry.json()["error"]
        assert generation.id in error["message"]
        if door == "messages":
            assert retry.json()["type"] == "error" and error["type"] == "invalid_request_error"
        else:
            assert error["code"] == "idempotency_answer_lost"
