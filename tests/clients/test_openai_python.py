"""openai-python, sync and async, as its users call it: nothing changed but the base URL."""

from __future__ import annotations

import asyncio
import json
import time
from decimal import Decimal

import openai
import pytest
import requests
from pydantic import BaseModel

from tests.conftest import running_server
from tests.upstream_server import ReplayServer, Reply

HELLO = [{"role": "user", "content": "Hello"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


def cost_of(usage) -> Decimal:
    """Read the gateway's usage.cost.total_cost where the SDK keeps unknown fields."""
    return Decimal(str(usage.model_extra["cost"]["total_cost"]))


def test_models_list_and_retrieve_agree(client):
    listed = {model.id: model for model in client.models.list()}

    retrieved = client.models.retrieve("dev-chat")

    assert retrieved.id == "dev-chat" and retrieved.object == "model"
    assert retrieved.model_dump() == listed["dev-chat"].model_dump()
    assert retrieved.model_extra["pricing"]["completion"] == 1.5


@pytest.mark.parametrize("model_id", ["no-such-model", "dev-hidden"])
def test_retrieving_a_model_not_served_is_404_model_not_found(client, model_id):
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve(model_id)

    error = caught.value.response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "model_not_found")
    assert model_id in error["message"] and "does not exist" in error["message"]


def test_retrieving_a_model_needs_a_key(live_server):
    response = requests.get(f"{live_server.url}/v1/models/dev-chat", timeout=30)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_sync_completion_reports_its_cost(client):
    reply = client.chat.completions.create(model="dev-chat", messages=HELLO, max_tokens=40)

    assert reply.choices[0].message.content.startswith("Hello")
    assert isinstance(reply.system_fingerprint, str)
    usage = reply.usage
    expected = usage.prompt_tokens * Decimal("0.50") + usage.completion_tokens * Decimal("1.50")
    assert cost_of(usage) == expected / 1_000_000


def test_stream_with_include_usage_ends_with_the_cost(client):
    chunks = list(
        client.chat.completions.create(
            model="dev-chat",
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text.startswith("Hello")
    assert all(chunk.usage is None for chunk in chunks[:-1])
    final = chunks[-1]
    assert final.choices == [] and cost_of(final.usage) > 0
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens


def test_async_client_completes_and_streams(base_url, funded_key):
    async def call() -> tuple:
        async with openai.AsyncOpenAI(
            base_url=base_url, api_key=funded_key.key, max_retries=0, timeout=30
        ) as client:
            whole = await client.chat.completions.create(
                model="dev-chat-mini", messages=HELLO, seed=5
            )
            stream = await client.chat.completions.create(
                model="dev-chat-mini",
                messages=HELLO,
                seed=5,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            return whole, chunks

    whole, chunks = asyncio.run(call())

    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert streamed == whole.choices[0].message.content
    assert cost_of(chunks[-1].usage) == cost_of(whole.usage) > 0


def test_with_raw_response_exposes_the_headers(client):
    raw = client.chat.completions.with_raw_response.create(model="dev-chat-mini", messages=HELLO)

    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.headers["x-request-id"]
    assert float(raw.headers["x-gateway-overhead-ms"]) >= 0
    completion = raw.parse()
    assert completion.object == "chat.completion" and cost_of(completion.usage) > 0


class CityWeather(BaseModel):
    city: str
    temperature_celsius: float
    raining: bool


def test_parse_returns_a_pydantic_model_from_json_schema_output(client):
    completion = client.chat.completions.parse(
        model="dev-chat",
        messages=[{"role": "user", "content": "Weather in Paris as JSON"}],
        response_format=CityWeather,
    )

    message = completion.choices[0].message
    assert isinstance(message.parsed, CityWeather)
    assert CityWeather.model_validate_json(message.content) == message.parsed
    assert cost_of(completion.usage) > 0


def test_a_tool_round_trip(client):
    messages = [{"role": "user", "content": "Use get_weather for Paris"}]
    first = client.chat.completions.create(
        model="dev-chat", messages=messages, tools=[WEATHER_TOOL]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments["unit"] in {"celsius", "fahrenheit"}

    messages += [
        choice.message.model_dump(exclude_none=True, exclude={"reasoning", "reasoning_details"}),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'},
    ]
    answer = client.chat.completions.create(
        model="dev-chat", messages=messages, tools=[WEATHER_TOOL]
    )

    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content.startswith('Tool result received: {"temperature": 18}')
    assert cost_of(first.usage) > 0 and cost_of(answer.usage) > 0


def test_the_sdk_retries_a_429_after_its_retry_after(app, database_url, tmp_path, make_funded_key):
    key = make_funded_key().key
    with running_server(database_url, tmp_path, RATE_LIMIT="1 per 2 second") as server:
        patient = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=2)
        hasty = patient.with_options(max_retries=0)
        patient.chat.completions.create(model="dev-chat-mini", messages=HELLO)

        with pytest.raises(openai.RateLimitError) as caught:
            hasty.chat.completions.create(model="dev-chat-mini", messages=HELLO)
        retry_after = int(caught.value.response.headers["retry-after"])
        assert 1 <= retry_after <= 2
        assert caught.value.response.json()["error"]["type"] == "rate_limit_error"

        started = time.monotonic()
        raw = patient.chat.completions.with_raw_response.create(
            model="dev-chat-mini", messages=HELLO
        )

    assert raw.parse().choices[0].message.content.startswith("Hello")
    assert int(raw.http_request.headers["x-stainless-retry-count"]) >= 1
    assert time.monotonic() - started >= retry_after - 1


UPSTREAM_CATALOG = """
[upstreams.flaky]
kind = "openai"
base_url = "{url}/flaky/v1"
retries = 0

[[models]]
id = "gpt-mini"
max_output_tokens = 1024
pricing = {{ prompt = 0.15, completion = 0.60 }}
routes = [{{ upstream = "flaky", model = "gpt-4o-mini-2024-07-18" }}]
"""


def test_the_sdk_retries_when_the_upstream_answers_503(app, database_url, tmp_path, funded_key):
    upstream = ReplayServer()
    catalog = tmp_path / "models.toml"
    catalog.write_text(UPSTREAM_CATALOG.format(url=upstream.url))
    try:
        with running_server(database_url, tmp_path, catalog=str(catalog)) as server:
            sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key=funded_key.key, max_retries=0)
            upstream.script("/flaky", Reply("openai_error_503"))
            with pytest.raises(openai.APIStatusError) as caught:
                sdk.chat.completions.create(model="gpt-mini", messages=HELLO)
            upstream.script("/flaky", Reply("openai_error_503"), Reply("openai_chat"))
            answer = sdk.with_options(max_retries=2).chat.completions.create(
                model="gpt-mini", messages=HELLO
            )
    finally:
        upstream.close()

    assert caught.value.status_code == 503
    error = caught.value.response.json()["error"]
    assert (error["type"], error["code"]) == ("api_error", "upstream_unavailable")
    assert "gpt-4o" not in error["message"] and "127.0.0.1" not in error["message"]
    assert answer.choices[0].message.content == "The capital of France is Paris."
    assert cost_of(answer.usage) > 0
    assert len(upstream.exchanges_to("/flaky")) == 3
