"""Too many requests: 429 in the envelope, per API key, shared across workers via Redis."""

from __future__ import annotations

import openai
import pytest
import requests

from tests.conftest import running_server

HELLO = [{"role": "user", "content": "hello"}]


def client_for(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)


def test_a_key_over_its_limit_gets_429_others_do_not(database_url, tmp_path, make_funded_key):
    busy, quiet = make_funded_key(), make_funded_key()
    with running_server(database_url, tmp_path, RATE_LIMIT="3 per minute") as server:
        client = client_for(server, busy.key)
        for _ in range(3):
            client.chat.completions.create(model="dev-chat-mini", messages=HELLO)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="dev-chat-mini", messages=HELLO)
        assert client_for(server, quiet.key).models.list().data
        probes = [requests.get(f"{server.url}/healthz").status_code for _ in range(5)]

    response = caught.value.response
    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) > 0
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "3 per 1 minute" in error["message"]
    assert probes == [200] * 5


def test_limits_are_shared_by_workers_through_redis(database_url, tmp_path, make_funded_key):
    funded = make_funded_key()
    with running_server(
        database_url,
        tmp_path,
        RATE_LIMIT="4 per minute",
        REDIS_URL="redis://127.0.0.1:6379/0",
        WEB_CONCURRENCY="2",
    ) as server:
        statuses = [
            requests.get(
                f"{server.url}/v1/models",
                headers={"Authorization": f"Bearer {funded.key}", "Connection": "close"},
                timeout=30,
            ).status_code
            for _ in range(8)
        ]
    assert statuses == [200] * 4 + [429] * 4
