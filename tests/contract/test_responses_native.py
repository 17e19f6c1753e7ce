"""The Responses door passed through natively to an upstream that serves /v1/responses.

Gunicorn serves a catalog whose route says ``api = "responses"``; the replay server
plays Responses transcripts for it; callers use the openai SDK. What reached the
upstream is read from the replay server's record, what was charged from the ledger.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal

import openai
import pytest
import requests

from app.catalog.pricing import cost_of
from app.providers.base import Usage
from tests.clients.test_codex_cli import run_codex
from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import Reply, load_transcript

CATALOG = """
[upstreams.openai]
kind = "openai"
base_url = "{url}/openai/v1"
api_key_env = "OPENAI_TEST_KEY"
retries = 0

[upstreams.vllm]
kind = "openai"
base_url = "{url}/vllm/v1"
retries = 0

[[models]]
id = "qwen-think"
context_length = 32000
max_output_tokens = 2048
capabilities = ["reasoning"]
pricing = {{ prompt = 0.1, completion = 0.4 }}
routes = [{{ upstream = "vllm", model = "Qwen/Qwen3-8B" }}]

[[models]]
id = "gpt-five"
context_length = 400000
max_output_tokens = 4096
capabilities = ["tools", "json_schema", "reasoning", "vision"]
routes = [{{ upstream = "openai", model = "gpt-5-mini-2025-08-07", api = "responses" }}]
[models.pricing]
prompt = 1.25
completion = 10
cached_read = 0.125
# The web search it is offered (Codex offers it) is priced: an unpriced one is refused.
tool_calls = {{ web_search = 0.01 }}
"""
UPSTREAM_KEY = "sk-openai-test-secret"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
# Tools the gateway cannot run itself: passed through, they reach the upstream as sent.
HOSTED = [
    {"type": "web_search", "search_context_size": "medium"},
    {
        "type": "namespace",
        "name": "files",
        "description": "The workspace",
        "tools": [
            {"type": "function", "name": "read", "parameters": {"type": "object"}, "strict": False},
        ],
    },
]
ASKED = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}]}


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("responses-native")
    with gateway_serving(
        CATALOG.format(url=upstream.url), database_url, folder, OPENAI_TEST_KEY=UPSTREAM_KEY
    ) as gateway:
        yield gateway


@pytest.fixture(autouse=True)
def scripted(upstream):
    """Every test scripts its upstream replies, and uses all of them."""
    upstream.reset()
    yield upstream
    assert upstream.unused_replies() == {}


@pytest.fixture
def funded(make_funded_key):
    return make_funded_key(Decimal("5"))


@pytest.fixture
def client(gateway, funded):
    return openai.OpenAI(
        base_url=f"{gateway.url}/v1", api_key=funded.key, max_retries=0, timeout=30
    )


def transcript_body(name: str) -> dict:
    return json.loads(load_transcript(name)[1])


def transcript_events(name: str) -> list[dict]:
    body = load_transcript(name)[1].decode()
    return [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]


def usage_of(body: dict) -> Usage:
    usage = body["usage"]
    return Usage(
        prompt_tokens=usage["input_tokens"],
        cached_tokens=usage["input_tokens_details"]["cached_tokens"],
        completion_tokens=usage["output_tokens"],
        reasoning_tokens=usage["output_tokens_details"]["reasoning_tokens"],
    )


def charged(app, gateway, funded, *transcripts: dict) -> list:
    """Check that each generation was charged its transcript's usage at the catalog's price."""
    account, generations, charges, holds = billing_records(app, funded.account_id)
    pricing = gateway.catalog.resolve("gpt-five").pricing
    costs = [cost_of(usage_of(body), pricing) for body in transcripts]
    assert sorted(generation.cost for generation in generations) == sorted(costs)
    assert all(generation.api == "responses" for generation in generations)
    assert sorted(charge.amount for charge in charges) == sorted(-cost for cost in costs)
    assert {hold.status for hold in holds} == {"settled"} and account.reserved == 0
    assert account.balance == Decimal("5") - sum(costs)
    return generations


def total_cost(usage) -> Decimal:
    return Decimal(str(usage.model_extra["cost"]["total_cost"]))


def audit_clean(runner, funded) -> None:
    audit = runner.invoke(args=["ledger", "audit", "--account", str(funded.account_id)])
    assert audit.exit_code == 0, audit.output
    assert "generations: 0 mismatches, 0 shortfalls, 0 estimated" in audit.output


def test_a_function_call_round_trip_keeps_encrypted_reasoning_byte_for_byte(
    app, gateway, client, funded, scripted, runner
):
    scripted.script("/openai", Reply("openai_response_function_call"), Reply("openai_response"))
    called, answered = (
        transcript_body("openai_response_function_call"),
        transcript_body("openai_response"),
    )

    first = client.responses.create(
        model="gpt-five",
        input="Weather?",
        tools=[WEATHER, *HOSTED],
        include=["reasoning.encrypted_content"],
        reasoning={"effort": "low", "summary": "auto"},
        extra_body={"prompt_cache_retention": "24h"},
    )
    second = client.responses.create(
        model="gpt-five",
        previous_response_id=first.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": "call_0000000000000000000000c1",
                "output": "18 C",
            }
        ],
        tools=[WEATHER],
        include=["reasoning.encrypted_content"],
    )

    sent_first, sent_second = scripted.exchanges
    assert sent_first.path == "/openai/v1/responses"
    assert sent_first.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sent_first.json == {
        "model": "gpt-5-mini-2025-08-07",
        "input": [ASKED],
        "tools": [WEATHER, *HOSTED],
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "low", "summary": "auto"},
        "prompt_cache_retention": "24h",
        "store": False,
        "max_output_tokens": 4096,
    }
    reasoning, call = called["output"]
    assert sent_second.json["input"] == [
        ASKED,
        reasoning,
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "18 C"},
    ]
    # The encrypted reasoning goes back exactly as the upstream wrote it.
    assert json.dumps(reasoning["encrypted_content"]).encode() in sent_second.body
    assert "previous_response_id" not in sent_second.json and sent_second.json["store"] is False
    assert first.id.startswith("resp_") and first.id != called["id"]
    assert first.model == "gpt-five" and first.store is True
    assert first.output[0].encrypted_content == reasoning["encrypted_content"]
    assert (first.output[1].name, first.output[1].arguments) == ("get_weather", '{"city":"Paris"}')
    assert second.output_text == "It is 18 C and sunny in Paris."
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(second.id).output_text == second.output_text
    listed = client.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in listed.data] == ["function_call_output"]
    first_generation, second_generation = sorted(
        charged(app, gateway, funded, called, answered), key=lambda g: g.created_at
    )
    assert (first_generation.id, second_generation.id) == (first.id, second.id)
    assert total_cost(first.usage) == first_generation.cost
    assert (first_generation.cached_tokens, first_generation.reasoning_tokens) == (128, 64)
    # Recorded as they ended: the first for its tool call, the second with its answer.
    assert [(g.status, g.finish_reason) for g in (first_generation, second_generation)] == [
        ("completed", "tool_calls"),
        ("completed", "stop"),
    ]
    audit_clean(runner, funded)


def test_a_stream_is_relayed_event_by_event_and_its_response_continued(
    app, gateway, client, funded, scripted, runner
):
    scripted.script("/openai", Reply("openai_response_stream", write_size=13))
    scripted.script("/openai", Reply("openai_response"))
    upstream_events = transcript_events("openai_response_stream")

    events = list(
        client.responses.create(
            model="gpt-five",
            input="Weather?",
            stream=True,
            include=["reasoning.encrypted_content"],
            reasoning={"summary": "auto"},
        )
    )
    final = events[-1].response
    continued = client.responses.create(
        model="gpt-five", previous_response_id=final.id, input="And tomorrow?"
    )

    assert [event.type for event in events] == [event["type"] for event in upstream_events]
    assert [event.sequence_number for event in events] == list(range(len(upstream_events)))
    responses = [event.response for event in events if hasattr(event, "response")]
    assert {response.id for response in responses} == {final.id} and final.id.startswith("resp_")
    assert {response.model for response in responses} == {"gpt-five"}
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == final.output_text == "Paris is sunny, 18 C."
    done = upstream_events[-1]["response"]
    assert [item.model_dump(exclude_none=True) for item in final.output] == done["output"]
    stream_generation, _ = sorted(
        charged(app, gateway, funded, done, transcript_body("openai_response")),
        key=lambda g: g.created_at,
    )
    assert stream_generation.streamed and stream_generation.id == final.id
    assert (stream_generation.status, stream_generation.finish_reason) == ("completed", "stop")
    assert total_cost(final.usage) == stream_generation.cost
    sent = scripted.exchanges[1].json
    assert sent["input"] == [
        ASKED,
        *done["output"],
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "And tomorrow?"}],
        },
    ]
    assert continued.previous_response_id == final.id
    audit_clean(runner, funded)


def test_an_upstream_error_is_answered_in_the_envelope_and_costs_nothing(
    app, client, funded, scripted
):
    scripted.script("/openai", Reply("openai_error_400"))

    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(
            model="gpt-five", input="Weather?", text={"format": {"type": "json_object"}}
        )

    error = caught.value.response.json()["error"]
    assert error["type"] == "invalid_request_error" and "json" in error["message"]
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert charges == [] and account.balance == Decimal("5") and account.reserved == 0
    assert [generation.status for generation in generations] == ["failed"]
    assert [hold.status for hold in holds] == ["settled"]


def test_a_caller_hanging_up_mid_stream_is_billed_for_what_it_received(
    app, gateway, funded, scripted
):
    scripted.script("/openai", Reply("openai_response_stream", repeat_event=11, pause=0.05))
    response = requests.post(
        f"{gateway.url}/v1/responses",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={"model": "gpt-five", "input": "Weather?", "stream": True},
        stream=True,
        timeout=30,
    )
    lines = response.iter_lines()
    deltas = 0
    while deltas < 2:
        deltas += next(lines) == b"event: response.output_text.delta"
    response.close()

    generation = settled_generation(app, funded.account_id)
    account, _, charges, holds = billing_records(app, funded.account_id)
    assert generation.status == "cancelled" and generation.estimated
    # The reasoning summary and two words were delivered; the upstream's usage never came.
    assert 0 < generation.completion_tokens < 58
    assert [charge.amount for charge in charges] == [-generation.cost] and generation.cost > 0
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0


def settled_generation(app, account_id: int):
    """Return the account's one generation once the gateway has settled it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if generations := billing_records(app, account_id)[1]:
            return generations[0]
        time.sleep(0.05)
    raise AssertionError("the generation was never settled")


def test_a_conversation_begun_on_a_translated_route_continues_passed_through(client, scripted):
    scripted.script("/vllm", Reply("vllm_chat_reasoning"))
    scripted.script("/openai", Reply("openai_response"))

    first = client.responses.create(model="qwen-think", input="9.11 or 9.8?")
    client.responses.create(model="gpt-five", previous_response_id=first.id, input="Sure?")

    assert [item.type for item in first.output] == ["reasoning", "message"]
    # The ids the gateway made, and reasoning no upstream can read back, stay here.
    assert scripted.exchanges_to("/openai")[0].json["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "9.11 or 9.8?"}],
        },
        {
            key: value
            for key, value in first.output[1].model_dump(exclude_none=True).items()
            if key != "id"
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Sure?"}]},
    ]


def test_codex_cli_runs_through_a_native_route_and_pays_its_usage(
    app, gateway, funded, scripted, tmp_path
):
    scripted.script("/openai", Reply("openai_response_stream", write_size=64))

    printed = run_codex(tmp_path, f"{gateway.url}/v1", funded.key, "-m", "gpt-five", "Weather?")

    assert "Paris is sunny, 18 C." in printed
    (exchange,) = scripted.exchanges
    sent = exchange.json
    # Codex's own request goes on as it sent it: its tools, include, reasoning and cache key.
    assert sent["model"] == "gpt-5-mini-2025-08-07" and sent["stream"] is True
    assert sent["store"] is False and "reasoning.encrypted_content" in sent["include"]
    assert sent["prompt_cache_key"] and "client_metadata" in sent
    assert {"function", "namespace", "web_search"} == {tool["type"] for tool in sent["tools"]}
    account, (generation,), charges, holds = billing_records(app, funded.account_id)
    done = transcript_events("openai_response_stream")[-1]["response"]
    price = gateway.catalog.resolve("gpt-five").pricing
    assert generation.cost == cost_of(usage_of(done), price) and generation.streamed
    assert [-charge.amount for charge in charges] == [generation.cost]
    assert account.reserved == 0 and [hold.status for hold in holds] == ["settled"]


def test_a_response_the_upstream_fails_mid_stream_is_billed_for_what_it_delivered(
    app, client, funded, scripted
):
    scripted.script("/openai", Reply("openai_response_stream_failed"))

    events = list(client.responses.create(model="gpt-five", input="Weather?", stream=True))

    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.id.startswith("resp_")
    assert failed.response.error.code == "server_error"
    assert [event.type for event in events].count("error") == 0
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(failed.response.id)
    account, (generation,), charges, holds = billing_records(app, funded.account_id)
    # The upstream reported no usage: what it delivered is counted, the prompt estimated.
    assert generation.estimated and generation.completion_tokens == 2 and generation.cost > 0
    # Recorded as the upstream said it ended: failed.
    assert (generation.status, generation.finish_reason) == ("failed", None)
    assert [-charge.amount for charge in charges] == [generation.cost]
    assert account.reserved == 0 and [hold.status for hold in holds] == ["settled"]
    # It shows the usage billed, which the upstream did not report.
    assert failed.response.usage.output_tokens == 2
    assert total_cost(failed.response.usage) == generation.cost


def test_a_repeated_idempotency_key_is_answered_once_and_charged_once(
    app, gateway, client, funded, scripted
):
    scripted.script("/openai", Reply("openai_response"))
    key = {"Idempotency-Key": "native-once"}

    first = client.responses.create(model="gpt-five", input="Weather?", extra_headers=key)
    again = client.responses.with_raw_response.create(
        model="gpt-five", input="Weather?", extra_headers=key
    )

    assert len(scripted.exchanges) == 1
    assert again.headers["Idempotent-Replayed"] == "true" and again.parse().id == first.id
    charged(app, gateway, funded, transcript_body("openai_response"))


def test_a_stream_the_upstream_fails_with_its_usage_is_recorded_failed_and_charged_that(
    app, gateway, client, funded, scripted
):
    scripted.script("/openai", Reply("openai_response_stream_failed_usage"))

    events = list(client.responses.create(model="gpt-five", input="Weather?", stream=True))

    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.error.code == "server_error"
    reported = transcript_events("openai_response_stream_failed_usage")[-1]["response"]
    (generation,) = charged(app, gateway, funded, reported)
    # What the upstream reported, not what the gateway counted of the two words delivered.
    assert not generation.estimated and generation.completion_tokens == 9
    assert (generation.status, generation.finish_reason) == ("failed", None)
    assert failed.response.usage.output_tokens == 9
    assert total_cost(failed.response.usage) == generation.cost


def test_a_stream_the_upstream_ends_incomplete_is_recorded_with_its_reason(
    app, gateway, client, funded, scripted
):
    scripted.script("/openai", Reply("openai_response_stream_incomplete"))

    events = list(client.responses.create(model="gpt-five", input="Weather?", stream=True))

    incomplete = events[-1]
    assert incomplete.type == "response.incomplete"
    assert incomplete.response.incomplete_details.reason == "max_output_tokens"
    reported = transcript_events("openai_response_stream_incomplete")[-1]["response"]
    (generation,) = charged(app, gateway, funded, reported)
    # As a translated answer cut at its output limit is recorded.
    assert (generation.status, generation.finish_reason) == ("completed", "length")
    assert client.responses.retrieve(incomplete.response.id).status == "incomplete"


def test_an_upstreams_error_event_reaches_the_caller_as_sent_once_the_stream_is_billed(
    app, gateway, funded, scripted
):
    # The upstream pauses after its error event: one sent on at once arrives unbilled.
    scripted.script(
        "/openai", Reply("openai_response_stream_error", stall_after_events=7, stall_seconds=1)
    )
    response = requests.post(
        f"{gateway.url}/v1/responses",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={"model": "gpt-five", "input": "Weather?", "stream": True},
        stream=True,
        timeout=30,
    )
    lines = response.iter_lines()
    while (line := next(lines)) != b"event: error":
        pass

    account, (generation,), charges, holds = billing_records(app, funded.account_id)
    assert generation.status == "failed" and [-charge.amount for charge in charges] == [
        generation.cost
    ]
    assert account.reserved == 0 and [hold.status for hold in holds] == ["settled"]
    sent = load_transcript("openai_response_stream_error")[1].split(b"\n\n")[6]
    assert b"%s\n%s" % (line, next(lines)) == sent
    rest = b"\n".join(lines)
    assert rest.count(b"event: ") == 1 and b"event: response.failed" in rest
