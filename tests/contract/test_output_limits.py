"""One output limit goes upstream, and usage beyond the hold is charged, not capped."""

from __future__ import annotations

from decimal import Decimal

import pytest
import requests
from sqlalchemy import select

from app.accounts.keys import create_key
from app.credits.models import Account
from app.extensions import db
from app.generations.models import Generation
from tests.contract.conftest import gateway_serving
from tests.factories import AccountFactory
from tests.upstream_server import Reply

CATALOG = """
[upstreams.own]
kind = "openai"
base_url = "{url}/own/v1"
retries = 0

[upstreams.reasoner]
kind = "openai"
base_url = "{url}/reasoner/v1"
max_tokens_field = "max_completion_tokens"
retries = 0

[[models]]
id = "story"
max_output_tokens = 4096
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [{{ upstream = "own", model = "Qwen/Qwen3-8B" }}]

[[models]]
id = "thinker"
max_output_tokens = 8192
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [{{ upstream = "reasoner", model = "o-mini" }}]
"""
# What tests/fixtures/transcripts/openai_chat_overrun.http reports: 12 prompt tokens and
# 250,000 completion tokens, at the prices above.
OVERRUN_PRICE = Decimal("0.1000012")
HELLO = [{"role": "user", "content": "Tell me a story"}]


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("output-limits")
    with gateway_serving(CATALOG.format(url=upstream.url), database_url, folder) as gateway:
        yield gateway


@pytest.fixture(autouse=True)
def scripted(upstream):
    upstream.reset()
    yield upstream
    assert upstream.unused_replies() == {}


def post(gateway, key, body):
    return requests.post(
        f"{gateway.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=body,
        timeout=30,
    )


def generation_of(app, generation_id):
    with app.app_context():
        db.session.expire_all()
        return db.session.get(Generation, generation_id)


def balance_of(app, account_id):
    with app.app_context():
        db.session.expire_all()
        account = db.session.get(Account, account_id)
        return account.balance, account.reserved


@pytest.mark.parametrize(
    ("model", "field", "limits", "sent"),
    [
        ("story", "max_tokens", {"max_completion_tokens": 1, "max_tokens": 1000000}, 1),
        ("story", "max_tokens", {"max_tokens": 7}, 7),
        ("story", "max_tokens", {}, 4096),
        ("thinker", "max_completion_tokens", {"max_tokens": 9}, 9),
        ("thinker", "max_completion_tokens", {}, 8192),
    ],
)
def test_the_upstream_gets_exactly_the_limit_the_hold_was_sized_for(
    gateway, scripted, make_funded_key, model, field, limits, sent
):
    prefix = "/own" if model == "story" else "/reasoner"
    scripted.script(prefix, Reply("openai_chat"))
    funded = make_funded_key(Decimal("5"))
    response = post(gateway, funded.key, {"model": model, "messages": HELLO, **limits})
    assert response.status_code == 200, response.text
    (exchange,) = scripted.exchanges
    sent_limits = {k: v for k, v in exchange.json.items() if k.startswith("max_")}
    assert sent_limits == {field: sent}


def test_usage_beyond_the_hold_is_charged_in_full_when_the_balance_covers_it(
    app, gateway, scripted, make_funded_key, runner
):
    scripted.script("/own", Reply("openai_chat_overrun"))
    funded = make_funded_key(Decimal("5"))
    body = {"model": "story", "messages": HELLO, "max_completion_tokens": 1, "max_tokens": 10**6}
    response = post(gateway, funded.key, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert Decimal(str(answer["usage"]["cost"]["total_cost"])) == OVERRUN_PRICE
    generation = generation_of(app, answer["id"])
    assert generation.cost == OVERRUN_PRICE and generation.shortfall == 0
    assert balance_of(app, funded.account_id) == (Decimal("5") - OVERRUN_PRICE, 0)
    audit = runner.invoke(args=["ledger", "audit", "--account", str(funded.account_id)])
    assert audit.exit_code == 0 and f"generation {answer['id']}" not in audit.output


def test_usage_beyond_what_the_account_has_is_charged_to_zero_and_the_shortfall_kept(
    app, gateway, scripted, make_funded_key, runner
):
    scripted.script("/own", Reply("openai_chat_overrun"))
    funded = make_funded_key(Decimal("0.03"))
    response = post(gateway, funded.key, {"model": "story", "messages": HELLO, "max_tokens": 1})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert Decimal(str(answer["usage"]["cost"]["total_cost"])) == Decimal("0.03")
    generation = generation_of(app, answer["id"])
    assert generation.cost == Decimal("0.03")
    assert generation.shortfall == OVERRUN_PRICE - Decimal("0.03")
    assert balance_of(app, funded.account_id) == (0, 0)
    audit = runner.invoke(args=["ledger", "audit", "--account", str(funded.account_id)])
    assert audit.exit_code == 0, audit.output
    assert f"shortfall: generation {answer['id']}: priced at $0.1000012" in audit.output
    assert "mismatch:" not in audit.output
    assert f"generation {answer['id']} priced at $0.1000012" in gateway.log.read_text()


def test_usage_beyond_the_hold_stops_at_the_keys_monthly_limit(app, gateway, scripted, runner):
    scripted.script("/own", Reply("openai_chat_overrun"))
    with app.app_context():
        account = AccountFactory.create(credits=Decimal("5"))
        issued = create_key(account_id=account.id, name="capped", monthly_limit=Decimal("0.05"))
        account_id = account.id
    response = post(gateway, issued.value, {"model": "story", "messages": HELLO, "max_tokens": 1})
    assert response.status_code == 200, response.text
    answer = response.json()
    assert Decimal(str(answer["usage"]["cost"]["total_cost"])) == Decimal("0.05")
    assert generation_of(app, answer["id"]).shortfall == OVERRUN_PRICE - Decimal("0.05")
    assert balance_of(app, account_id) == (Decimal("4.95"), 0)
    with app.app_context():
        spent = db.session.scalar(select(Generation.cost).where(Generation.api_key_id == issued.id))
    assert spent == Decimal("0.05")
