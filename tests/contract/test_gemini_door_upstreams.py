"""The Gemini door on real upstreams, translated: an OpenAI-compatible server and Anthropic's.

Gunicorn serves a catalog whose upstreams the replay server plays; callers use
google-genai. What reaches the upstream is read from the replay server's record.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from google import genai
from google.genai import types

from app.catalog.pricing import cost_of
from app.providers.base import Usage
from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import Reply

CATALOG = """
[upstreams.third]
kind = "openai"
base_url = "{url}/third/v1"
api_key_env = "THIRD_API_KEY"
retries = 0

[upstreams.claude]
kind = "anthropic"
base_url = "{url}/claude"
api_key_env = "CLAUDE_API_KEY"
retries = 0

[[models]]
id = "gpt-mini"
context_length = 128000
max_output_tokens = 4096
capabilities = ["tools", "json_schema", "vision"]
pricing = {{ prompt = 0.15, completion = 0.60, cached_read = 0.075 }}
routes = [{{ upstream = "third", model = "gpt-4o-mini-2024-07-18" }}]

[[models]]
id = "claude-sonnet"
context_length = 200000
max_output_tokens = 8192
capabilities = ["tools", "reasoning", "vision"]
pricing = {{ prompt = 3, completion = 15, cached_read = 0.30, cache_write = 3.75 }}
routes = [{{ upstream = "claude", model = "claude-sonnet-4-5-20250929" }}]
"""
WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="Current weather in a city",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={"city": types.Schema(type=types.Type.STRING, nullable=True)},
    ),
)
# A conversation as Gemini CLI continues one: a call without an id, its result, a question.
CONVERSATION = [
    types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]),
    types.Content(
        role="model",
        parts=[
            types.Part(text="Let me look.", thought=True, thought_signature=b"sig"),
            types.Part(
                function_call=types.FunctionCall(name="get_weather", args={"city": "Paris"})
            ),
        ],
    ),
    types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(
                    name="get_weather", response={"output": "18 C"}
                )
            ),
            types.Part(text="And in Rome, and Paris again?"),
        ],
    ),
]


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemini-upstreams")
    with gateway_serving(
        CATALOG.format(url=upstream.url),
        database_url,
        folder,
        THIRD_API_KEY="sk-third-test-secret",
        CLAUDE_API_KEY="sk-ant-test-secret",
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
def gemini(gateway, funded, monkeypatch, tmp_path):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    http = types.HttpOptions(base_url=gateway.url, retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=funded.key, http_options=http)


def settled(app, gateway, funded, model_id: str):
    """Return the one generation of the account, checked to be charged at its price."""
    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    usage = Usage(
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        cached_tokens=generation.cached_tokens,
        cache_write_tokens=generation.cache_write_tokens,
        reasoning_tokens=generation.reasoning_tokens,
    )
    assert generation.cost == cost_of(usage, gateway.catalog.resolve(model_id).pricing) > 0
    assert charge.amount == -generation.cost and generation.api == "gemini"
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0
    assert account.balance == Decimal("5") - generation.cost
    return generation


def test_a_conversation_with_tools_is_translated_to_an_openai_compatible_upstream(
    app, gateway, gemini, funded, scripted
):
    scripted.script("/third", Reply("openai_chat_tool_calls"))

    response = gemini.models.generate_content(
        model="gpt-mini",
        contents=CONVERSATION,
        config=types.GenerateContentConfig(
            system_instruction="Be brief.",
            tools=[types.Tool(function_declarations=[WEATHER]), types.Tool(google_search={})],
            tool_config=types.ToolConfig(
                function_calling_config=types.FunctionCallingConfig(mode="ANY")
            ),
            max_output_tokens=65536,
            stop_sequences=["END"],
            top_k=20,
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        ),
    )

    (exchange,) = scripted.exchanges
    assert exchange.path == "/third/v1/chat/completions"
    sent = exchange.json
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1_1", "content": '{"output":"18 C"}'},
        {"role": "user", "content": [{"type": "text", "text": "And in Rome, and Paris again?"}]},
    ]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": ["string", "null"]}},
                },
            },
        }
    ]
    assert sent["tool_choice"] == "required"
    assert (sent["max_tokens"], sent["stop"]) == (4096, ["END"])
    calls = response.function_calls
    assert [call.name for call in calls] == ["get_weather", "get_weather"]
    assert all(call.id and isinstance(call.args, dict) for call in calls)
    generation = settled(app, gateway, funded, "gpt-mini")
    assert generation.id == response.response_id
    assert response.usage_metadata.prompt_token_count == generation.prompt_tokens


def test_a_stream_of_tool_calls_gives_each_call_whole(app, gateway, gemini, funded, scripted):
    scripted.script("/third", Reply("openai_chat_stream_tools"))

    chunks = list(
        gemini.models.generate_content_stream(
            model="gpt-mini",
            contents="Weather in Paris and Rome?",
            config=types.GenerateContentConfig(tools=[types.Tool(function_declarations=[WEATHER])]),
        )
    )

    calls = [call for chunk in chunks for call in chunk.function_calls or ()]
    assert [call.args["city"] for call in calls] == ["Paris", "Rome"]
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    generation = settled(app, gateway, funded, "gpt-mini")
    assert generation.streamed and chunks[-1].usage_metadata.total_token_count == (
        generation.prompt_tokens + generation.completion_tokens
    )


def test_thoughts_from_anthropic_are_shown_as_thought_parts_when_asked_for(
    app, gateway, gemini, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_stream_thinking"))

    chunks = list(
        gemini.models.generate_content_stream(
            model="claude-sonnet",
            contents="Which is greater, 9.11 or 9.8?",
            config=types.GenerateContentConfig(
                thinking_config=types.ThinkingConfig(thinking_budget=2048, include_thoughts=True)
            ),
        )
    )

    parts = [part for chunk in chunks for part in chunk.candidates[0].content.parts or ()]
    thought = "".join(part.text for part in parts if part.thought)
    assert thought == "Compare 9.11 and 9.8 as decimals: 9.80 > 9.11, so 9.8 is greater."
    assert "".join(part.text for part in parts if not part.thought)
    (exchange,) = scripted.exchanges
    assert exchange.json["thinking"]["type"] == "enabled"
    generation = settled(app, gateway, funded, "claude-sonnet")
    usage = chunks[-1].usage_metadata
    assert usage.thoughts_token_count == generation.reasoning_tokens
    assert usage.candidates_token_count + usage.thoughts_token_count == generation.completion_tokens
