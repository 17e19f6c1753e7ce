"""Gemini models behind the gateway: every door's requests translated to Google's Gemini API.

Gunicorn serves a catalog whose gemini upstreams the replay server plays, with Google's
wire format; callers use the openai SDK (Chat Completions, Responses) and the anthropic
SDK (Messages). What reaches the upstream is read from the replay server's record; what
was charged, from the generation record and the ledger.
"""

from __future__ import annotations

import json
from decimal import Decimal

import anthropic
import openai
import pytest
import requests

from app.catalog.pricing import cost_of
from app.providers.base import Usage
from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import Reply

KEY = "AIzaSy-test-only-gemini-key-0000000000"
MODEL = "gemini-2.5-flash"
CATALOG = """
[upstreams.google]
kind = "gemini"
base_url = "{url}/google"
api_key_env = "GEMINI_API_KEY"
retries = 0

[upstreams.google-busy]
kind = "gemini"
base_url = "{url}/busy"
api_key_env = "GEMINI_API_KEY"
retries = 0

[[models]]
id = "gemini-flash"
context_length = 1048576
max_output_tokens = 8192
capabilities = ["tools", "json_schema", "reasoning", "vision"]
pricing = {{ prompt = 0.30, completion = 2.50, cached_read = 0.03 }}
routes = [{{ upstream = "google", model = "gemini-2.5-flash" }}]

[[models]]
id = "gemini-failover"
max_output_tokens = 8192
capabilities = ["tools", "reasoning"]
pricing = {{ prompt = 0.30, completion = 2.50, cached_read = 0.03 }}
routes = [
  {{ upstream = "google-busy", model = "gemini-2.5-flash" }},
  {{ upstream = "google", model = "gemini-2.5-flash" }},
]
"""
PRICE = {"prompt": Decimal("0.30"), "completion": Decimal("2.50"), "cached_read": Decimal("0.03")}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}
MESSAGES_WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": WEATHER["function"]["parameters"],
}
# gemini_generate and gemini_stream: 2100 prompt tokens of which 2048 read from the cache,
# 8 (streamed: 9) answer tokens after 180 (240) thinking tokens.
CACHED_COST = (52 * PRICE["prompt"] + 2048 * PRICE["cached_read"] + 188 * PRICE["completion"]) / (
    1_000_000
)
STREAMED_COST = (52 * PRICE["prompt"] + 2048 * PRICE["cached_read"] + 249 * PRICE["completion"]) / (
    1_000_000
)


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemini-upstreams")
    with gateway_serving(
        CATALOG.format(url=upstream.url), database_url, folder, GEMINI_API_KEY=KEY
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


@pytest.fixture
def claude(gateway, funded, monkeypatch, tmp_path):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return anthropic.Anthropic(base_url=gateway.url, api_key=funded.key, max_retries=0, timeout=30)


def settled(app, gateway, funded, api: str):
    """Return the one generation of the account, checked charged once at its price."""
    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    usage = Usage(
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        cached_tokens=generation.cached_tokens,
        reasoning_tokens=generation.reasoning_tokens,
    )
    pricing = gateway.catalog.resolve(generation.model).pricing
    assert generation.cost == cost_of(usage, pricing) > 0
    assert charge.amount == -generation.cost and charge.generation_id == generation.id
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0
    assert account.balance == Decimal("5") - generation.cost
    assert generation.api == api and generation.status == "completed"
    return generation


def sent_to_google(scripted, stream: bool = False):
    """Return the one request Google's API received, checked to be its call, with the key."""
    (exchange,) = scripted.exchanges
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    assert exchange.path == f"/google/v1beta/models/{MODEL}:{method}"
    assert exchange.headers["x-goog-api-key"] == KEY
    return exchange.json


def test_a_chat_completion_bills_cache_reads_at_cached_read_and_thoughts_at_completion(
    app, gateway, client, funded, scripted
):
    scripted.script("/google", Reply("gemini_generate"))

    completion = client.chat.completions.create(
        model="gemini-flash",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
        ],
        max_tokens=1000,
        temperature=0.2,
        stop=["END"],
        reasoning_effort="low",
    )

    sent = sent_to_google(scripted)
    assert sent == {
        "contents": [{"role": "user", "parts": [{"text": "Capital of France?"}]}],
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {
            "maxOutputTokens": 1000,
            "temperature": 0.2,
            "stopSequences": ["END"],
            "thinkingConfig": {"thinkingBudget": 750, "includeThoughts": True},
        },
    }
    assert completion.choices[0].message.content == "The capital of France is Paris."
    assert completion.model == "gemini-flash" and completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (2100, 188)
    assert usage.prompt_tokens_details.cached_tokens == 2048
    assert usage.completion_tokens_details.reasoning_tokens == 180
    generation = settled(app, gateway, funded, "chat")
    assert (generation.prompt_tokens, generation.cached_tokens) == (2100, 2048)
    assert (generation.completion_tokens, generation.reasoning_tokens) == (188, 180)
    assert generation.cost == CACHED_COST
    assert Decimal(str(usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_a_streamed_chat_completion_relays_a_function_call_and_bills_its_thoughts(
    app, gateway, client, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream_tool_call", write_size=7))

    chunks = list(
        client.chat.completions.create(
            model="gemini-flash",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[WEATHER],
            tool_choice="required",
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    sent = sent_to_google(scripted, stream=True)
    assert sent["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert sent["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    (call,) = calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    assert call.id.startswith("call_")
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls"
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (96, 168)
    generation = settled(app, gateway, funded, "chat")
    assert (generation.reasoning_tokens, generation.finish_reason) == (150, "tool_calls")
    assert generation.cost == (96 * PRICE["prompt"] + 168 * PRICE["completion"]) / 1_000_000
    assert Decimal(str(usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_a_tool_result_goes_back_as_a_function_response_of_the_call_it_answers(client, scripted):
    scripted.script("/google", Reply("gemini_generate"))

    client.chat.completions.create(
        model="gemini-flash",
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_gm_0001",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_gm_0001", "content": "18 C"},
        ],
        tools=[WEATHER],
    )

    assert sent_to_google(scripted)["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                    "thoughtSignature": "skip_thought_signature_validator",
                }
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"result": "18 C"}}}
            ],
        },
    ]


def test_the_responses_door_gets_function_calls_and_their_thought_summary(
    app, gateway, client, funded, scripted
):
    scripted.script("/google", Reply("gemini_generate_tool_call"))

    response = client.responses.create(
        model="gemini-flash",
        instructions="Be brief.",
        input="Weather in Paris and Rome?",
        tools=[RESPONSES_WEATHER],
        reasoning={"effort": "medium"},
    )

    sent = sent_to_google(scripted)
    assert sent["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert sent["generationConfig"]["thinkingConfig"]["includeThoughts"] is True
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert len({call.call_id for call in calls}) == 2
    generation = settled(app, gateway, funded, "responses")
    assert (generation.completion_tokens, generation.reasoning_tokens) == (246, 212)
    assert response.usage.output_tokens_details.reasoning_tokens == 212
    assert Decimal(str(response.usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_a_streamed_response_bills_its_cache_reads_and_thoughts(
    app, gateway, client, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream", write_size=13))

    with client.responses.stream(model="gemini-flash", input="9.11 or 9.8?") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    sent_to_google(scripted, stream=True)
    assert final.output_text == "9.8 is greater than 9.11." and kinds[-1] == "response.completed"
    assert final.usage.input_tokens_details.cached_tokens == 2048
    generation = settled(app, gateway, funded, "responses")
    assert (generation.cached_tokens, generation.completion_tokens) == (2048, 249)
    assert generation.cost == STREAMED_COST
    assert Decimal(str(final.usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_the_messages_door_gets_a_gemini_answer(app, gateway, claude, funded, scripted):
    scripted.script("/google", Reply("gemini_generate"))

    message = claude.messages.create(
        model="gemini-flash",
        max_tokens=500,
        system="Be brief.",
        messages=[{"role": "user", "content": "Capital of France?"}],
        tools=[MESSAGES_WEATHER],
    )

    sent = sent_to_google(scripted)
    assert sent["generationConfig"]["maxOutputTokens"] == 500
    assert (
        sent["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"]
        == (MESSAGES_WEATHER["input_schema"])
    )
    assert [block.text for block in message.content] == ["The capital of France is Paris."]
    assert message.stop_reason == "end_turn" and message.model == "gemini-flash"
    assert message.usage.cache_read_input_tokens == 2048
    generation = settled(app, gateway, funded, "messages")
    assert generation.cost == CACHED_COST
    assert Decimal(str(message.usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_a_streamed_message_shows_gemini_thoughts_as_thinking(
    app, gateway, claude, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream", write_size=5))

    with claude.messages.stream(
        model="gemini-flash",
        max_tokens=4000,
        messages=[{"role": "user", "content": "9.11 or 9.8?"}],
        thinking={"type": "enabled", "budget_tokens": 2048},
    ) as stream:
        final = stream.get_final_message()

    sent = sent_to_google(scripted, stream=True)
    assert sent["generationConfig"]["thinkingConfig"]["includeThoughts"] is True
    thinking, text = final.content
    assert thinking.thinking == "**Comparing decimals**\n\n9.80 against 9.11."
    assert text.text == "9.8 is greater than 9.11."
    generation = settled(app, gateway, funded, "messages")
    assert generation.cost == STREAMED_COST


def test_a_route_out_of_quota_fails_over_to_the_next(app, gateway, client, funded, scripted):
    scripted.script("/busy", Reply("gemini_error_429"))
    scripted.script("/google", Reply("gemini_generate"))

    completion = client.chat.completions.create(
        model="gemini-failover", messages=[{"role": "user", "content": "Capital of France?"}]
    )

    assert [e.path.split("/")[1] for e in scripted.exchanges] == ["busy", "google"]
    assert completion.choices[0].message.content == "The capital of France is Paris."
    generation = settled(app, gateway, funded, "chat")
    assert generation.cost == CACHED_COST


@pytest.mark.parametrize(
    ("busy", "error", "status"),
    [
        ("gemini_error_503", openai.APIStatusError, 503),
        ("gemini_error_500", openai.APIStatusError, 503),
    ],
)
def test_every_route_failing_is_an_error_charged_nothing(
    app, client, funded, scripted, busy, error, status
):
    scripted.script("/busy", Reply(busy))
    scripted.script("/google", Reply("gemini_error_503"))

    with pytest.raises(error) as caught:
        client.chat.completions.create(
            model="gemini-failover", messages=[{"role": "user", "content": "Hi"}]
        )

    assert caught.value.status_code == status
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert charges == [] and account.balance == Decimal("5") and account.reserved == 0
    assert [generation.status for generation in generations] == ["failed"]


def test_a_refusal_is_passed_on_with_the_public_model_name(app, client, funded, scripted):
    scripted.script("/google", Reply("gemini_error_400"))

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gemini-flash", messages=[{"role": "user", "content": "Hi"}]
        )

    message = caught.value.body["message"]
    assert "at most 5 stop sequences" in message and MODEL not in message
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert charges == [] and account.balance == Decimal("5")


def test_a_refused_key_is_the_operators_problem_and_never_reaches_the_log(
    gateway, client, scripted
):
    scripted.script("/google", Reply("gemini_error_400_key"))

    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="gemini-flash", messages=[{"role": "user", "content": "Hi"}]
        )

    assert caught.value.status_code == 502
    assert "API key" not in json.dumps(caught.value.body)
    log = gateway.log.read_text()
    assert "upstream google refused the gateway (400 INVALID_ARGUMENT)" in log
    # Every request of this module sent the key upstream; none wrote it down.
    assert KEY not in log and KEY[:12] not in log


def test_a_stream_gemini_breaks_off_ends_in_an_error_billed_for_its_prompt_and_text(
    app, gateway, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream_error"))

    response = requests.post(
        f"{gateway.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={"model": "gemini-flash", "messages": [{"role": "user", "content": "A story?"}],
              "stream": True},
        stream=True,
        timeout=30,
    )  # fmt: skip

    events = [line[6:] for line in response.iter_lines(decode_unicode=True) if line]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["type"] == "api_error"
    pieces = [
        choice["delta"].get("content") or ""
        for event in events[:-2]
        for choice in json.loads(event)["choices"]
    ]
    assert "".join(pieces) == "Once upon a time"
    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    assert (generation.status, generation.estimated) == ("failed", True)
    # Gemini counted the prompt on its first event: that count, not the hold's estimate.
    assert generation.prompt_tokens == 10
    route = gateway.catalog.resolve("gemini-flash").routes[0]
    counted = sum(route.adapter.count_text_tokens(piece, route.target) for piece in pieces if piece)
    assert generation.completion_tokens == counted
    assert charge.amount == -generation.cost and generation.cost > 0 and account.reserved == 0
