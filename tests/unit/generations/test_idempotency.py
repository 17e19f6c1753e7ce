"""An Idempotency-Key charges its request once, whatever stops the worker running it."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select, update

from app.credits import ledger
from app.database import utcnow
from app.extensions import db
from app.generations import decorators
from app.generations.models import FAILED, Generation, IdempotentRequest
from tests.contract.conftest import billing_records

BODY = json.dumps({"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hi"}]})
DIGEST = hashlib.sha256(BODY.encode()).hexdigest()


class WorkerKilled(BaseException):
    """The worker process died here: nothing after this line of it ran."""


def post(client, key: str, idempotency_key: str):
    return client.post(
        "/v1/chat/completions",
        data=BODY,
        headers={
            "Authorization": f"Bearer {key}",
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key,
        },
    )


def age_claim(app, account_id: int, key: str, age: timedelta) -> IdempotentRequest:
    """Make the claim of ``key`` ``age`` old; return it."""
    with app.app_context():
        db.session.execute(
            update(IdempotentRequest)
            .where(IdempotentRequest.account_id == account_id, IdempotentRequest.key == key)
            .values(created_at=utcnow() - age)
        )
        db.session.commit()
        claim = db.session.scalar(
            select(IdempotentRequest).where(
                IdempotentRequest.account_id == account_id, IdempotentRequest.key == key
            )
        )
        db.session.expunge(claim)
        return claim


def leave_claim(app, account_id: int, key: str, generation_id: str, age: timedelta) -> None:
    """Leave an unanswered claim naming ``generation_id``, as a worker that died would."""
    with app.app_context():
        db.session.add(
            IdempotentRequest(
                account_id=account_id,
                key=key,
                body_digest=DIGEST,
                generation_id=generation_id,
                created_at=utcnow() - age,
            )
        )
        db.session.commit()


def ttl(app) -> timedelta:
    return timedelta(seconds=app.config["HOLD_TTL_SECONDS"])


def test_a_charge_whose_answer_was_lost_is_never_run_again(app, client, funded_key, monkeypatch):
    def killed(claim, body):
        raise WorkerKilled()

    monkeypatch.setattr(decorators, "store_answer", killed)
    with pytest.raises(WorkerKilled):
        post(client, funded_key.key, "lost-answer")
    monkeypatch.undo()
    claim = age_claim(app, funded_key.account_id, "lost-answer", ttl(app) + timedelta(seconds=5))

    retries = [post(client, funded_key.key, "lost-answer") for _ in range(2)]

    _, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert [g.id for g in generations] == [claim.generation_id]
    assert len(charges) == 1 and charges[0].generation_id == claim.generation_id
    assert [h.id for h in holds] == [claim.generation_id]
    for retry in retries:
        assert retry.status_code == 409
        error = retry.get_json()["error"]
        assert error["code"] == "idempotency_answer_lost"
        assert claim.generation_id in error["message"]


def test_a_request_still_holding_credit_is_not_run_twice_however_long_it_runs(
    app, client, funded_key
):
    generation_id = "chatcmpl-still-running"
    leave_claim(app, funded_key.account_id, "slow", generation_id, ttl(app) * 3)
    with app.app_context():
        hold = ledger.place_hold(
            account_id=funded_key.account_id,
            amount=Decimal("0.01"),
            ttl_seconds=60,
            hold_id=generation_id,
        )

    retry = post(client, funded_key.key, "slow")

    assert retry.status_code == 409
    assert retry.get_json()["error"]["code"] == "idempotency_key_in_use"
    with app.app_context():
        ledger.settle_hold(hold, cost=Decimal(0), generation_id=generation_id)


def test_a_claim_is_not_taken_over_before_its_request_could_hold_credit(app, client, funded_key):
    leave_claim(app, funded_key.account_id, "starting", "chatcmpl-starting", ttl(app) / 2)

    retry = post(client, funded_key.key, "starting")

    assert retry.status_code == 409
    assert retry.get_json()["error"]["code"] == "idempotency_key_in_use"


@pytest.mark.parametrize("hold", ["released", "never placed", "failed at no cost"])
def test_a_request_that_died_without_charging_is_run_by_its_retry(app, client, funded_key, hold):
    generation_id = f"chatcmpl-dead-{hold.replace(' ', '-')}"
    leave_claim(app, funded_key.account_id, "dead", generation_id, ttl(app) * 2)
    with app.app_context():
        if hold != "never placed":
            held = ledger.place_hold(
                account_id=funded_key.account_id,
                amount=Decimal("0.01"),
                ttl_seconds=60,
                hold_id=generation_id,
            )
        if hold == "released":
            ledger.extend_holds([held.id], ttl_seconds=-1)
            assert ledger.release_expired_holds(account_id=funded_key.account_id) == 1
        if hold == "failed at no cost":
            record = generation_row(generation_id, funded_key.account_id)
            ledger.settle_hold(held, cost=Decimal(0), generation_id=generation_id, record=record)

    retry = post(client, funded_key.key, "dead")

    assert retry.status_code == 200, retry.get_data(as_text=True)
    assert retry.get_json()["id"] != generation_id
    _, generations, charges, _ = billing_records(app, funded_key.account_id)
    assert [c.generation_id for c in charges] == [retry.get_json()["id"]]


def generation_row(generation_id: str, account_id: int):
    """The records of a generation that failed before producing anything."""
    statement = db.metadata.tables["generations"].insert()
    row = {
        "id": generation_id,
        "account_id": account_id,
        "model": "dev-chat-mini",
        "status": FAILED,
        "price_prompt": Decimal(0),
        "price_completion": Decimal(0),
        "price_cached_read": Decimal(0),
        "price_image": Decimal(0),
        "created_at": utcnow(),
    }
    return statement, row


def test_the_generation_answered_under_a_key_is_the_one_its_claim_names(app, client, funded_key):
    answer = post(client, funded_key.key, "named")

    claim = age_claim(app, funded_key.account_id, "named", timedelta(0))
    assert answer.get_json()["id"] == claim.generation_id
    with app.app_context():
        assert db.session.get(Generation, claim.generation_id) is not None
