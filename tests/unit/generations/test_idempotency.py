"""An Idempotency-Key charges its request once, whatever stops the worker running it."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from app.completions import views as completions_views
from app.credits.balances import HeldCredit
from app.credits.errors import HoldVoided
from app.credits.expiry import extend_holds, release_expired_holds, void_hold
from app.credits.holds import place_hold
from app.credits.models import Hold
from app.credits.settlement import settle_hold
from app.database import utcnow, write_transaction
from app.extensions import db
from app.generations import decorators
from app.generations.audit import audit_ledger
from app.generations.idempotency import Claim, release_claim, store_answer
from app.generations.lifecycle import rollup_of
from app.generations.models import COMPLETED, FAILED, Generation, IdempotentRequest
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
        hold = place_hold(
            account_id=funded_key.account_id,
            amount=Decimal("0.01"),
            ttl_seconds=60,
            hold_id=generation_id,
        )

    retry = post(client, funded_key.key, "slow")

    assert retry.status_code == 409
    assert retry.get_json()["error"]["code"] == "idempotency_key_in_use"
    with app.app_context():
        settle_hold(hold, cost=Decimal(0), generation_id=generation_id)


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
            held = place_hold(
                account_id=funded_key.account_id,
                amount=Decimal("0.01"),
                ttl_seconds=60,
                hold_id=generation_id,
            )
        if hold == "released":
            extend_holds([held.id], ttl_seconds=-1)
            assert release_expired_holds(account_id=funded_key.account_id) == 1
        if hold == "failed at no cost":
            record = generation_row(generation_id, funded_key.account_id)
            settle_hold(held, cost=Decimal(0), generation_id=generation_id, record=record)

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


def take_over(app, client, funded_key, hold: str, name: str = "stalled") -> str:
    """Leave a claim whose request seems dead (its hold ``hold``); let a retry take it over.

    Return the id of the generation the first request ran under, which may yet come back.
    """
    generation_id = f"chatcmpl-{name}-{hold.replace(' ', '-')}"
    leave_claim(app, funded_key.account_id, "stalled", generation_id, ttl(app) * 2)
    if hold == "released":
        with app.app_context():
            held = place_hold(
                account_id=funded_key.account_id,
                amount=Decimal("0.01"),
                ttl_seconds=-1,
                hold_id=generation_id,
            )
            assert release_expired_holds(account_id=funded_key.account_id) == 1
            assert held.id == generation_id
    retry = post(client, funded_key.key, "stalled")
    assert retry.status_code == 200, retry.get_data(as_text=True)
    return generation_id


def test_a_request_taken_over_while_it_stalled_charges_nothing_if_it_settles(
    app, client, funded_key
):
    stalled = take_over(app, client, funded_key, "released")
    hold = HeldCredit(
        id=stalled, account_id=funded_key.account_id, amount=Decimal("0.01"), key_id=None
    )
    statement, row = generation_row(stalled, funded_key.account_id)
    row.update(status=COMPLETED, prompt_tokens=5, completion_tokens=20)
    row.update(cached_tokens=0, reasoning_tokens=0)

    with app.app_context():
        charged = settle_hold(
            hold,
            cost=Decimal("0.02"),
            generation_id=stalled,
            record=(statement, row),
            rollup=rollup_of(row),
        )

    assert charged == 0
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert len(charges) == 1 and charges[0].generation_id != stalled
    assert {h.id: h.status for h in holds}[stalled] == "voided"
    late = next(g for g in generations if g.id == stalled)
    assert (late.cost, late.shortfall) == (0, Decimal("0.02"))
    assert account.balance == Decimal("10") + charges[0].amount
    with app.app_context():
        assert audit_ledger([funded_key.account_id]).mismatches == []
        db.session.commit()


def test_a_request_taken_over_before_it_held_credit_cannot_hold_it(
    app, client, funded_key, monkeypatch
):
    stalled = take_over(app, client, funded_key, "never placed")

    with app.app_context(), pytest.raises(HoldVoided):
        place_hold(
            account_id=funded_key.account_id,
            amount=Decimal("0.01"),
            ttl_seconds=60,
            hold_id=stalled,
        )
    # Its request, coming back to place it, is told its retry runs it.
    monkeypatch.setattr(
        decorators, "claim_key", lambda **claimed: Claim(id=0, generation_id=stalled)
    )
    back = post(client, funded_key.key, "stalled")
    assert back.status_code == 409
    assert back.get_json()["error"]["code"] == "idempotency_key_in_use"
    _, _, charges, _ = billing_records(app, funded_key.account_id)
    assert len(charges) == 1 and charges[0].generation_id != stalled


@pytest.mark.parametrize("seen", [None, "expired"])
def test_a_hold_that_changed_since_it_was_seen_is_not_voided(app, funded_key, seen):
    with app.app_context():
        held = place_hold(
            account_id=funded_key.account_id,
            amount=Decimal("0.01"),
            ttl_seconds=60,
            hold_id=f"chatcmpl-came-back-{seen}",
        )
        if seen == "expired":
            # Seen expired, then its late settlement charged it.
            settle_hold(held, cost=Decimal("0.01"), generation_id=held.id)

        voided = write_transaction(
            lambda connection: void_hold(
                connection, hold_id=held.id, account_id=funded_key.account_id, seen=seen
            )
        )

        assert voided is False
        assert db.session.get(Hold, held.id).status != "voided"
        db.session.commit()


def test_a_request_taken_over_neither_stores_nor_releases_its_retrys_claim(app, client, funded_key):
    stalled = take_over(app, client, funded_key, "released", name="stored")
    retrys = age_claim(app, funded_key.account_id, "stalled", timedelta(0))
    # SQLite may give the deleted claim's id to the retry's.
    came_back = Claim(id=retrys.id, generation_id=stalled)

    with app.app_context():
        store_answer(came_back, b"{}")
        release_claim(came_back)

    assert age_claim(app, funded_key.account_id, "stalled", timedelta(0)).response == (
        retrys.response
    )


def test_a_failure_after_the_charge_keeps_the_claim_bound_to_its_generation(
    app, client, funded_key, monkeypatch
):
    """The answer was charged, then writing it out failed: the retry is not run again."""

    def dropped(generation, answer):
        raise OperationalError("SELECT 1", {}, ConnectionError("the connection dropped"))

    monkeypatch.setattr(completions_views, "completion_body", dropped)
    first = post(client, funded_key.key, "charged-then-failed")
    monkeypatch.undo()

    retry = post(client, funded_key.key, "charged-then-failed")

    assert first.status_code == 500
    _, generations, charges, _ = billing_records(app, funded_key.account_id)
    (generation,) = generations
    assert [c.generation_id for c in charges] == [generation.id] and generation.cost > 0
    assert retry.status_code == 409
    assert retry.get_json()["error"]["code"] == "idempotency_answer_lost"


def test_a_failure_before_anything_was_charged_gives_the_key_back(
    app, client, funded_key, monkeypatch
):
    def unavailable(*args, **kwargs):
        raise OperationalError("SELECT 1", {}, ConnectionError("the connection dropped"))

    monkeypatch.setattr(completions_views, "start_generation", unavailable)
    first = post(client, funded_key.key, "failed-uncharged")
    monkeypatch.undo()

    retry = post(client, funded_key.key, "failed-uncharged")

    assert first.status_code == 500
    assert retry.status_code == 200, retry.get_data(as_text=True)
    _, _, charges, _ = billing_records(app, funded_key.account_id)
    assert [c.generation_id for c in charges] == [retry.get_json()["id"]]
