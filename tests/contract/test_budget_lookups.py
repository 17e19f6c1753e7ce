"""Budgets seen by callers: GET /v1/key shows them, each door's 402 names the one that stopped."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
import requests
from sqlalchemy import select

from app.accounts.budgets import set_key_budget, set_member_budget
from app.auth.models import ApiKey
from app.extensions import db


def post(server, path: str, key: str, body: dict) -> requests.Response:
    return requests.post(
        f"{server.url}{path}", headers={"Authorization": f"Bearer {key}"}, json=body, timeout=30
    )


def decoded(response: requests.Response) -> dict:
    return json.loads(response.content, parse_float=Decimal)


def give_budgets(app, key_id: int, *, member: tuple, key: tuple | None = None) -> None:
    with app.app_context():
        member_id = db.session.scalar(select(ApiKey.member_id).where(ApiKey.id == key_id))
        set_member_budget(member_id, amount=member[0], window=member[1])
        if key is not None:
            set_key_budget(key_id, amount=key[0], window=key[1])


def test_get_key_shows_the_keys_and_its_members_budget(app, live_server, funded_key):
    give_budgets(app, funded_key.key_id, member=(Decimal("1"), "week"), key=(Decimal("0.5"), "5h"))
    answer = post(
        live_server,
        "/v1/chat/completions",
        funded_key.key,
        {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "Hello"}]},
    )
    cost = decoded(answer)["usage"]["cost"]["total_cost"]

    data = decoded(requests.get(
        f"{live_server.url}/v1/key",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        timeout=30,
    ))["data"]  # fmt: skip

    key, member = data["budget"], data["member_budget"]
    assert (key["amount"], key["window"], key["spent"]) == (Decimal("0.5"), "5h", cost)
    assert key["remaining"] == data["limit_remaining"] == Decimal("0.5") - cost
    assert data["limit"] == Decimal("0.5") and key["reserved"] == 0
    started = datetime.fromisoformat(key["window_start"])
    assert datetime.fromisoformat(key["resets_at"]) - started == timedelta(hours=5)
    assert (member["amount"], member["window"], member["spent"]) == (Decimal("1"), "week", cost)
    assert member["remaining"] == Decimal("1") - cost
    monday = datetime.fromisoformat(member["window_start"])
    assert (monday.weekday(), monday.hour, monday.minute) == (0, 0, 0)
    assert datetime.fromisoformat(member["resets_at"]) - monday == timedelta(days=7)


def test_without_budgets_get_key_shows_none(live_server, funded_key):
    data = decoded(requests.get(
        f"{live_server.url}/v1/key",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        timeout=30,
    ))["data"]  # fmt: skip

    for budget in (data["budget"], data["member_budget"]):
        assert (budget["amount"], budget["remaining"]) == (None, None)
        assert (budget["window"], budget["spent"]) == ("month", 0)


DOORS = [
    (
        "/v1/chat/completions",
        {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "Hi"}]},
        lambda body: body["error"]["message"],
    ),
    (
        "/v1/responses",
        {"model": "dev-chat-mini", "input": "Hi"},
        lambda body: body["error"]["message"],
    ),
    (
        "/v1/messages",
        {
            "model": "dev-chat-mini",
            "max_tokens": 32,
            "messages": [{"role": "user", "content": "Hi"}],
        },
        lambda body: body["error"]["message"] if body["type"] == "error" else None,
    ),
]


@pytest.mark.parametrize(("path", "body", "message_of"), DOORS)
def test_each_door_answers_402_naming_the_members_budget(
    app, live_server, make_funded_key, path, body, message_of
):
    funded = make_funded_key(Decimal("10"))
    give_budgets(app, funded.key_id, member=(Decimal("0"), "day"))

    refused = post(live_server, path, funded.key, body)

    assert refused.status_code == 402, refused.text
    message = message_of(decoded(refused))
    assert message.startswith("Insufficient credits under the member's daily budget of $0:")
    assert "Raise the budget or wait for the next day (UTC)." in message


@pytest.mark.parametrize(("path", "body", "message_of"), DOORS)
def test_each_door_answers_402_naming_the_keys_limit(
    app, live_server, make_funded_key, path, body, message_of
):
    funded = make_funded_key(Decimal("10"))
    give_budgets(app, funded.key_id, member=(Decimal("5"), "month"), key=(Decimal("0"), "week"))

    refused = post(live_server, path, funded.key, body)

    assert refused.status_code == 402, refused.text
    assert message_of(decoded(refused)).startswith(
        "Insufficient credits under this API key's weekly limit of $0:"
    )
