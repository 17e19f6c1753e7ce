"""Per-key limits over real HTTP: permitted models and a monthly spend limit."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import openai
import pytest
from sqlalchemy import select

from app.accounts.keys import create_key
from app.auth.models import ApiKey
from app.credits.balances import month_start
from app.credits.models import Account, Hold, LedgerEntry
from app.database import utcnow
from app.extensions import db
from app.generations.usage import key_spend
from tests.conftest import running_server
from tests.contract.conftest import billing_records
from tests.contract.test_concurrency import ask as race_request
from tests.factories import AccountFactory

NO_ACCESS = "does not exist or you do not have access to it"


@pytest.fixture
def make_limited_key(app):
    """``make_limited_key(models=..., limit=..., credits=...)``: (account id, key, key id)."""

    def make(models=None, limit=None, credits=Decimal("10")):
        with app.app_context():
            account = AccountFactory.create(credits=credits)
            issued = create_key(
                account_id=account.id, name="limited", permitted_models=models, monthly_limit=limit
            )
            return account.id, issued.value, issued.id

    return make


def ask(sdk: openai.OpenAI, model: str, **extra):
    return sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello there"}], **extra
    )


@pytest.mark.parametrize("stream", [False, True])
def test_a_key_gets_403_for_a_model_it_may_not_use(app, make_client, make_limited_key, stream):
    account_id, key, _ = make_limited_key(models=["dev-chat-mini"])
    sdk = make_client(key)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        ask(sdk, "dev-chat", stream=stream)
    error = refused.value.body
    assert refused.value.status_code == 403
    assert error["type"] == "invalid_request_error" and error["code"] == "model_not_found"
    assert NO_ACCESS in error["message"] and error["param"] == "model"
    assert ask(sdk, "dev-chat-mini").choices[0].message.content
    account, generations, _, holds = billing_records(app, account_id)
    assert [g.model for g in generations] == ["dev-chat-mini"] and len(holds) == 1


def test_an_unknown_model_stays_a_400_for_a_limited_key(make_client, make_limited_key):
    _, key, _ = make_limited_key(models=["dev-chat-mini"])
    with pytest.raises(openai.BadRequestError) as refused:
        ask(make_client(key), "no-such-model")
    assert refused.value.body["code"] == "model_not_found"


def test_models_lists_only_what_the_key_may_use(make_client, make_limited_key):
    _, limited, _ = make_limited_key(models=["dev-slow", "dev-chat-mini"])
    _, unlimited, _ = make_limited_key()
    assert [m.id for m in make_client(limited).models.list()] == ["dev-chat-mini", "dev-slow"]
    assert {m.id for m in make_client(unlimited).models.list()} == {
        "dev-chat",
        "dev-chat-mini",
        "dev-slow",
        "dev-dying",
        "dev-embed",
    }


def test_402_past_the_monthly_limit_names_the_limit_not_the_balance(
    app, make_client, make_limited_key
):
    account_id, key, key_id = make_limited_key(limit=Decimal("0.000100"))
    sdk = make_client(key)
    spent = Decimal(0)
    with pytest.raises(openai.APIStatusError) as refused:
        for _ in range(50):
            answer = ask(sdk, "dev-chat-mini", max_tokens=60)
            spent += Decimal(str(answer.usage.model_extra["cost"]["total_cost"]))
    assert refused.value.status_code == 402
    error = refused.value.body
    assert error["type"] == "insufficient_quota" and error["code"] == "insufficient_quota"
    assert "monthly limit of $0.0001" in error["message"]
    assert "balance" not in error["message"]
    account, _, _, _ = billing_records(app, account_id)
    assert Decimal("10") - account.balance == spent
    assert 0 < spent <= Decimal("0.0001")
    with app.app_context():
        assert key_spend(key_id, since=month_start(utcnow())) == spent


def test_a_zero_limit_refuses_every_request(app, make_client, make_limited_key):
    account_id, key, _ = make_limited_key(limit=Decimal(0))
    with pytest.raises(openai.APIStatusError) as refused:
        ask(make_client(key), "dev-chat-mini", stream=True)
    assert refused.value.status_code == 402
    assert "monthly limit of $0" in refused.value.body["message"]
    account, generations, charges, holds = billing_records(app, account_id)
    assert account.balance == Decimal("10") and not generations and not charges and not holds


LIMIT = Decimal("0.0003")
REQUESTS = 150
THREADS = 32


def test_racing_requests_never_take_a_key_past_its_monthly_limit(
    app, runner, database_url, tmp_path, make_limited_key
):
    account_id, key, key_id = make_limited_key(limit=LIMIT, credits=Decimal("100"))
    with running_server(database_url, tmp_path, WEB_CONCURRENCY="2") as server:
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(lambda i: race_request(server.url, key, i), range(REQUESTS)))

    statuses = [status for status, _, _ in results]
    assert set(statuses) == {200, 402}, "the key's limit must run out during the race"
    answered = sum(cost for status, _, cost in results if status == 200)
    with app.app_context():
        db.session.expire_all()
        balance, reserved = db.session.execute(
            select(Account.balance, Account.reserved).where(Account.id == account_id)
        ).one()
        month_spent, month_reserved = db.session.execute(
            select(ApiKey.window_spent, ApiKey.window_reserved).where(ApiKey.id == key_id)
        ).one()
        charged = -db.session.scalar(
            select(db.func.sum(LedgerEntry.amount)).where(
                LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge"
            )
        )
        open_holds = db.session.scalars(
            select(Hold.id).where(Hold.account_id == account_id, Hold.status == "open")
        ).all()
        spent = key_spend(key_id, since=month_start(utcnow()))
    assert charged == answered == spent == month_spent
    assert spent <= LIMIT
    assert balance == Decimal("100") - spent and reserved == 0
    assert month_reserved == 0 and open_holds == []
    audit = runner.invoke(args=["ledger", "audit", "--account", str(account_id)])
    assert audit.exit_code == 0, audit.output
