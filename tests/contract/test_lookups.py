"""GET /v1/generations/{id} and GET /v1/key: what callers can look up about their own use."""

from __future__ import annotations

import json
from decimal import Decimal

import requests

from app.accounts.keys import update_key_limits

HELLO = [{"role": "user", "content": "Hello"}]


def get(server, path, key, **headers):
    return requests.get(
        f"{server.url}{path}", headers={"Authorization": f"Bearer {key}", **headers}, timeout=30
    )


def decoded(response):
    return json.loads(response.content, parse_float=Decimal)


def test_a_whole_answers_generation_shows_its_tokens_cost_and_upstream(live_server, sdk):
    raw = sdk.chat.completions.with_raw_response.create(
        model="dev-chat", messages=HELLO, extra_headers={"X-Request-Id": "lookup-1"}
    )
    answer = raw.parse()

    response = get(live_server, f"/v1/generations/{answer.id}", sdk.api_key)

    assert response.status_code == 200, response.text
    data = decoded(response)["data"]
    assert data["id"] == answer.id and data["model"] == "dev-chat"
    assert data["request_id"] == raw.headers["x-request-id"] == "lookup-1"
    assert (data["status"], data["finish_reason"]) == ("completed", "stop")
    assert (data["streamed"], data["estimated"]) == (False, False)
    assert data["usage"]["prompt_tokens"] == answer.usage.prompt_tokens
    assert data["usage"]["completion_tokens"] == answer.usage.completion_tokens
    assert data["total_cost"] == Decimal(str(answer.usage.model_extra["cost"]["total_cost"]))
    assert data["latency_ms"] >= 0 and data["time_to_first_token_ms"] is None
    (upstream,) = data["upstreams"]
    assert (upstream["upstream"], upstream["outcome"]) == ("builtin", "ok")


def test_a_streamed_generation_shows_its_time_to_first_token(live_server, sdk):
    chunks = list(
        sdk.chat.completions.create(
            model="dev-slow", messages=[{"role": "user", "content": "a b c d"}], stream=True
        )
    )

    data = get(live_server, f"/v1/generations/{chunks[0].id}", sdk.api_key).json()["data"]

    assert data["streamed"] is True and data["status"] == "completed"
    assert 0 <= data["time_to_first_token_ms"] <= data["latency_ms"]


def test_another_accounts_generation_is_not_found(live_server, sdk, make_funded_key):
    answer = sdk.chat.completions.create(model="dev-chat-mini", messages=HELLO)
    stranger = make_funded_key()

    responses = [
        get(live_server, f"/v1/generations/{answer.id}", stranger.key),
        get(live_server, "/v1/generations/chatcmpl-000000000000000000000000", sdk.api_key),
        get(live_server, "/v1/generations/" + "x" * 300, sdk.api_key),
    ]

    for response in responses:
        assert response.status_code == 404
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "not_found",
            "id",
        )
    assert get(live_server, f"/v1/generations/{answer.id}", "sk-gw-bad").status_code == 401


def test_the_key_shows_its_limits_and_spend(app, live_server, make_funded_key, make_client):
    funded = make_funded_key()
    with app.app_context():
        update_key_limits(
            funded.key_id, permitted_models=["dev-chat-mini"], monthly_limit=Decimal("2.5")
        )
    client = make_client(funded.key)
    costs = [
        Decimal(
            str(
                client.chat.completions.create(
                    model="dev-chat-mini", messages=HELLO
                ).usage.model_extra["cost"]["total_cost"]
            )
        )
        for _ in range(2)
    ]

    response = get(live_server, "/v1/key", funded.key)

    assert response.status_code == 200
    data = decoded(response)["data"]
    assert data["name"] == "test" and funded.key.startswith(data["display_prefix"])
    assert data["permitted_models"] == ["dev-chat-mini"]
    assert data["limit"] == Decimal("2.5")
    assert data["usage_daily"] == data["usage_monthly"] == sum(costs) > 0
    assert data["limit_remaining"] == Decimal("2.5") - sum(costs)
    assert data["rate_limit"] == "600 per minute"
    assert funded.key not in response.text


def test_a_key_without_limits_shows_none(live_server, funded_key):
    data = get(live_server, "/v1/key", funded_key.key).json()["data"]

    assert (data["limit"], data["limit_remaining"], data["permitted_models"]) == (None, None, None)
    assert data["usage_daily"] == data["usage_monthly"] == 0


def test_api_answers_do_not_vary_by_cookie_but_dashboard_pages_do(live_server, funded_key):
    api = get(live_server, "/v1/key", funded_key.key, Cookie="session=anything")
    page = requests.get(f"{live_server.url}/signin", timeout=30)

    assert api.status_code == 200
    assert "cookie" not in api.headers.get("Vary", "").lower()
    assert "set-cookie" not in {name.lower() for name in api.headers}
    assert "cookie" in page.headers.get("Vary", "").lower()
