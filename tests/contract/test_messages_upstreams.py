"""The Messages door on real upstreams: translated, or passed through to Anthropic's own.

Gunicorn serves a catalog whose upstreams the replay server plays; callers use the
anthropic SDK. What reaches the upstream is read from the replay server's record.
"""

from __future__ import annotations

from decimal import Decimal

import anthropic
import pytest

from app.catalog.pricing import cost_of
from app.encoding import loads
from app.providers.anthropic import API_VERSION
from app.providers.base import Usage
from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import Reply, load_transcript

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

[upstreams.busy]
kind = "openai"
base_url = "{url}/busy/v1"
retries = 0

[[models]]
id = "gpt-mini"
context_length = 128000
max_output_tokens = 4096
capabilities = ["tools", "json_schema", "vision"]
extra_params = ["top_k"]
pricing = {{ prompt = 0.15, completion = 0.60, cached_read = 0.075 }}
routes = [{{ upstream = "third", model = "gpt-4o-mini-2024-07-18" }}]

[[models]]
id = "claude-sonnet"
context_length = 200000
max_output_tokens = 8192
capabilities = ["tools", "reasoning", "vision"]
pricing = {{ prompt = 3, completion = 15, cached_read = 0.30, cache_write = 3.75 }}
routes = [{{ upstream = "claude", model = "claude-sonnet-4-5-20250929" }}]

[[models]]
id = "busy"
pricing = {{ prompt = 1, completion = 1 }}
routes = [{{ upstream = "busy", model = "busy-model" }}]
"""
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": WEATHER["input_schema"],
        "description": "Current weather in a city",
    },
}
# A conversation as Claude Code continues one: an earlier call echoed with its thinking,
# its result, and a system turn after it.
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Call it.", "signature": "c2lnbmF0dXJl"},
            {
                "type": "tool_use",
                "id": "toolu_01",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01",
                "content": [{"type": "text", "text": "18 C"}],
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "And in Rome, and Paris again?"},
        ],
    },
    {"role": "system", "content": "Answer with tools."},
]
COMPARED = [{"role": "user", "content": "Which is greater, 9.11 or 9.8?"}]


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("messages-upstreams")
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
def claude(gateway, funded, monkeypatch, tmp_path):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return anthropic.Anthropic(base_url=gateway.url, api_key=funded.key, max_retries=0, timeout=30)


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
    assert charge.amount == -generation.cost and generation.api == "messages"
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0
    assert account.balance == Decimal("5") - generation.cost
    return generation


def cost_of_usage(usage) -> Decimal:
    return Decimal(str(usage.model_extra["cost"]["total_cost"]))


def test_a_conversation_with_tools_is_translated_to_an_openai_compatible_upstream(
    app, gateway, claude, funded, scripted
):
    scripted.script("/third", Reply("openai_chat_tool_calls"))

    message = claude.messages.create(
        model="gpt-mini",
        max_tokens=32000,
        system="Be brief.",
        messages=CONVERSATION,
        tools=[WEATHER],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        metadata={"user_id": "user-7"},
        thinking={"type": "adaptive"},
        extra_body={"top_k": 20, "output_config": {"effort": "high"}},
    )

    (exchange,) = scripted.exchanges
    assert exchange.path == "/third/v1/chat/completions"
    assert exchange.json == {
        "model": "gpt-4o-mini-2024-07-18",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_01",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_01", "content": "18 C"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "And in Rome, and Paris again?"}],
            },
            {"role": "system", "content": "Answer with tools."},
        ],
        "tools": [CHAT_WEATHER],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "stop": ["END"],
        "user": "user-7",
        "top_k": 20,
        "max_tokens": 4096,
    }
    assert [(block.type, block.input) for block in message.content] == [
        ("tool_use", {"city": "Paris"}),
        ("tool_use", {"city": "Rome"}),
    ]
    assert message.content[0].id == "call_0000000000000000000000c3"
    assert message.stop_reason == "tool_use" and message.model == "gpt-mini"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (131, 46)
    generation = settled(app, gateway, funded, "gpt-mini")
    assert cost_of_usage(message.usage) == generation.cost


@pytest.mark.parametrize(
    ("said", "stop_reason", "stop_sequence"),
    [
        # vLLM names the stop string that ended the answer.
        ("vllm_chat_stop_sequence", "stop_sequence", "END"),
        # Named none (it ended on its end-of-sequence token), none is made up: as OpenAI's.
        ("vllm_chat_reasoning", "end_turn", None),
    ],
)
def test_a_translated_answer_names_the_stop_sequence_its_upstream_says_it_ended_on(
    claude, scripted, said, stop_reason, stop_sequence
):
    scripted.script("/third", Reply(said))

    message = claude.messages.create(
        model="gpt-mini", max_tokens=500, messages=COMPARED, stop_sequences=["STOP", "END"]
    )

    assert scripted.exchanges[0].json["stop"] == ["STOP", "END"]
    assert (message.stop_reason, message.stop_sequence) == (stop_reason, stop_sequence)


def test_a_translated_stream_names_the_stop_sequence_in_its_message_delta(claude, scripted):
    scripted.script("/third", Reply("vllm_chat_stream_stop_sequence", write_size=13))

    with claude.messages.stream(
        model="gpt-mini", max_tokens=500, messages=COMPARED, stop_sequences=["END"]
    ) as stream:
        (delta,) = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()

    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == ("stop_sequence", "END")
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")


def test_a_streamed_answer_with_tool_calls_from_an_openai_compatible_upstream(
    app, gateway, claude, funded, scripted
):
    scripted.script("/third", Reply("openai_chat_stream_tools", write_size=7))

    with claude.messages.stream(
        model="gpt-mini", max_tokens=500, messages=CONVERSATION, tools=[WEATHER]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()

    assert scripted.exchanges[0].json["stream"] is True
    assert [(block.type, block.name, block.input) for block in final.content] == [
        ("tool_use", "get_weather", {"city": "Paris"}),
        ("tool_use", "get_weather", {"city": "Rome"}),
    ]
    starts = [event.index for event in events if event.type == "content_block_start"]
    assert starts == [0, 1] and final.stop_reason == "tool_use"
    (delta,) = [event for event in events if event.type == "message_delta"]
    assert (delta.usage.input_tokens, delta.usage.output_tokens) == (82, 46)
    generation = settled(app, gateway, funded, "gpt-mini")
    assert cost_of_usage(delta.usage) == generation.cost


def test_an_anthropic_routes_signed_thinking_tool_use_and_cache_writes_are_priced(
    app, gateway, claude, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_message_tool_use"))

    message = claude.messages.create(
        model="claude-sonnet",
        max_tokens=4000,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        thinking={"type": "enabled", "budget_tokens": 2048},
    )

    (exchange,) = scripted.exchanges
    assert exchange.json["thinking"]["type"] == "enabled"
    assert [block.type for block in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].signature == "RXVJQ2ZEZXN0LW9ubHktc2lnbmF0dXJlLW5vdC1hLXJlYWwtb25l"
    assert message.content[2].input == {"city": "Paris", "unit": "celsius"}
    usage = message.usage
    assert (usage.input_tokens, usage.cache_creation_input_tokens, usage.output_tokens) == (
        412,
        1024,
        96,
    )
    generation = settled(app, gateway, funded, "claude-sonnet")
    assert generation.cache_write_tokens == 1024
    expected = (412 * Decimal(3) + 1024 * Decimal("3.75") + 96 * Decimal(15)) / 1_000_000
    assert cost_of_usage(usage) == generation.cost == expected


def test_an_anthropic_routes_streamed_thinking_keeps_its_text_and_signature(
    app, gateway, claude, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_stream_thinking", write_size=11))

    with claude.messages.stream(
        model="claude-sonnet",
        max_tokens=4000,
        messages=[{"role": "user", "content": "Which is greater, 9.11 or 9.8?"}],
        thinking={"type": "enabled", "budget_tokens": 2048},
    ) as stream:
        final = stream.get_final_message()

    thinking, text = final.content
    assert thinking.thinking == "Compare 9.11 and 9.8 as decimals: 9.80 > 9.11, so 9.8 is greater."
    assert thinking.signature == "RXVJQ2ZEZXN0LW9ubHktc2lnbmF0dXJlLW5vdC1hLXJlYWwtb25lLTI="
    assert text.text == "9.8 is greater than 9.11."
    assert (final.usage.input_tokens, final.usage.output_tokens) == (48, 61)
    settled(app, gateway, funded, "claude-sonnet")


def test_every_route_overloaded_is_529_overloaded_error_charged_nothing(
    app, gateway, claude, funded, scripted
):
    scripted.script("/busy", Reply("openai_error_503"))

    with pytest.raises(anthropic.OverloadedError) as caught:
        claude.messages.create(
            model="busy", max_tokens=20, messages=[{"role": "user", "content": "Hi"}]
        )

    assert caught.value.status_code == 529
    assert caught.value.response.json()["error"]["type"] == "overloaded_error"
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert charges == [] and account.balance == Decimal("5") and account.reserved == 0
    assert [generation.status for generation in generations] == ["failed"]


def transcript_body(name: str) -> dict:
    return loads(load_transcript(name)[1])


def generations_of(app, funded, count: int) -> list:
    """Return the account's generations, each charged its cost, the holds all settled."""
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert len(generations) == count and account.reserved == 0
    assert sorted(-charge.amount for charge in charges) == sorted(g.cost for g in generations)
    assert {hold.status for hold in holds} == {"settled"}
    return sorted(generations, key=lambda generation: generation.created_at)


def test_an_anthropic_route_is_sent_the_callers_body_and_headers_as_they_came(
    gateway, claude, scripted
):
    scripted.script("/claude", Reply("anthropic_message"))
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    extra = {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}

    message = claude.messages.create(
        model="claude-sonnet",
        max_tokens=100,
        system=system,
        messages=[{"role": "user", "content": "Capital of France?"}],
        tools=[{**WEATHER, "defer_loading": True}],
        metadata={"user_id": '{"device_id": "d-1"}'},
        extra_body=extra,
        extra_headers={
            "anthropic-beta": "context-management-2025-06-27",
            "anthropic-version": "2026-10-21",
        },
    )

    (exchange,) = scripted.exchanges
    assert exchange.path == "/claude/v1/messages"
    assert exchange.json == {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 100,
        "system": system,
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "tools": [{**WEATHER, "defer_loading": True}],
        "metadata": {"user_id": '{"device_id": "d-1"}'},
        **extra,
    }
    assert exchange.headers["anthropic-beta"] == "context-management-2025-06-27"
    # The caller's version, not the one the gateway sends when it translates.
    assert exchange.headers["anthropic-version"] == "2026-10-21" != API_VERSION
    assert exchange.headers["x-api-key"] == "sk-ant-test-secret"
    assert message.model == "claude-sonnet" and message.id.startswith("msg_")
    assert message.id != transcript_body("anthropic_message")["id"]


def test_a_thinking_signature_comes_back_byte_identical_and_cache_reads_and_writes_are_priced(
    app, gateway, claude, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_message_tool_use"), Reply("anthropic_message"))
    asked = [{"role": "user", "content": "Weather in Paris?"}]
    thinking = {"type": "enabled", "budget_tokens": 2048}

    first = claude.messages.create(
        model="claude-sonnet", max_tokens=4000, messages=asked, tools=[WEATHER], thinking=thinking
    )
    # As Claude Code continues a conversation: the answer's blocks, as they came.
    blocks = [block.model_dump(exclude_none=True) for block in first.content]
    turn = {"role": "assistant", "content": blocks}
    result = {"type": "tool_result", "tool_use_id": first.content[2].id, "content": "18 C"}
    second = claude.messages.create(
        model="claude-sonnet",
        max_tokens=4000,
        messages=[*asked, turn, {"role": "user", "content": [result]}],
        tools=[WEATHER],
        thinking=thinking,
    )

    upstream_answer = transcript_body("anthropic_message_tool_use")
    sent_back = scripted.exchanges[1].json["messages"][1]["content"]
    assert sent_back == upstream_answer["content"]
    signature = upstream_answer["content"][0]["signature"]
    assert b'"signature":"%s"' % signature.encode() in scripted.exchanges[1].body
    written, read = generations_of(app, funded, 2)
    assert (written.cache_write_tokens, written.cached_tokens) == (1024, 0)
    assert (read.cache_write_tokens, read.cached_tokens) == (0, 2048)
    price = gateway.catalog.resolve("claude-sonnet").pricing
    assert written.cost == (412 * 3 + 1024 * Decimal("3.75") + 96 * 15) / Decimal(1_000_000)
    assert read.cost == (21 * 3 + 2048 * Decimal("0.30") + 10 * 15) / Decimal(1_000_000)
    assert (
        cost_of_usage(first.usage)
        == written.cost
        == cost_of(Usage(prompt_tokens=1436, completion_tokens=96, cache_write_tokens=1024), price)
    )
    assert cost_of_usage(second.usage) == read.cost
    assert second.usage.cache_read_input_tokens == 2048
    # Recorded as they stopped: the first for its tool call, the second with its answer.
    assert [(g.status, g.finish_reason) for g in (written, read)] == [
        ("completed", "tool_calls"),
        ("completed", "stop"),
    ]


def test_a_streamed_answer_passed_through_names_the_gateways_message_and_its_cost(
    app, gateway, claude, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_stream_thinking", write_size=11))

    with claude.messages.stream(
        model="claude-sonnet",
        max_tokens=4000,
        messages=[{"role": "user", "content": "Which is greater, 9.11 or 9.8?"}],
        thinking={"type": "enabled", "budget_tokens": 2048},
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()

    assert final.id.startswith("msg_") and final.model == "claude-sonnet"
    assert final.id != "msg_01A0000000000000000000004"
    assert [event.type for event in events][-2:] == ["message_delta", "message_stop"]
    (generation,) = generations_of(app, funded, 1)
    assert generation.id == final.id and generation.api == "messages"
    assert cost_of_usage(events[-2].usage) == generation.cost > 0
    assert (generation.status, generation.finish_reason) == ("completed", "stop")


def test_a_stream_the_upstream_breaks_ends_with_its_error_and_bills_what_was_delivered(
    app, gateway, claude, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_stream_error"))

    with pytest.raises(anthropic.APIStatusError) as caught:
        with claude.messages.stream(
            model="claude-sonnet",
            max_tokens=400,
            messages=[{"role": "user", "content": "Tell me a story."}],
        ) as stream:
            for _ in stream:
                pass

    assert caught.value.body["error"]["type"] == "overloaded_error"
    (generation,) = generations_of(app, funded, 1)
    # Two pieces of text went out: they are billed, counted (message_start said 1 token).
    assert generation.completion_tokens > 1 and generation.cost > 0
    assert generation.status == "failed"


def test_an_anthropic_routes_refusal_comes_back_in_anthropics_envelope_charged_nothing(
    app, gateway, claude, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_error_400"))

    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model="claude-sonnet", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        )

    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "claude-sonnet-4-5-20250929" not in caught.value.body["error"]["message"]
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert charges == [] and account.balance == Decimal("5") and account.reserved == 0


def test_a_max_tokens_past_the_models_limit_is_capped_with_its_thinking_budget(
    gateway, claude, scripted
):
    scripted.script("/claude", Reply("anthropic_message"))

    claude.messages.create(
        model="claude-sonnet",
        max_tokens=32000,
        messages=[{"role": "user", "content": "Capital of France?"}],
        thinking={"type": "enabled", "budget_tokens": 16000},
    )

    sent = scripted.exchanges[0].json
    assert sent["max_tokens"] == 8192
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 8191}


def test_a_repeated_idempotency_key_on_an_anthropic_route_is_answered_and_charged_once(
    app, gateway, claude, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_message"))
    key = {"Idempotency-Key": "messages-native-once"}
    asked = [{"role": "user", "content": "Capital of France?"}]

    first = claude.messages.create(
        model="claude-sonnet", max_tokens=100, messages=asked, extra_headers=key
    )
    again = claude.messages.with_raw_response.create(
        model="claude-sonnet", max_tokens=100, messages=asked, extra_headers=key
    )

    assert len(scripted.exchanges) == 1
    assert again.headers["Idempotent-Replayed"] == "true" and again.parse().id == first.id
    generations_of(app, funded, 1)
