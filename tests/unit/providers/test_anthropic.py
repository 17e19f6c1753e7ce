"""AnthropicAdapter: the translation both ways, and the adapter against replayed transcripts."""

from __future__ import annotations

import json
import time

import pytest

from app.providers.anthropic import (
    AnthropicAdapter,
    counted_calls,
    messages_request,
    usage_from,
)
from app.providers.base import ChatRequest, NativeCall, RouteTarget, UpstreamConfig
from app.providers.errors import (
    UpstreamError,
    UpstreamMisconfigured,
    UpstreamRejected,
    UpstreamUnavailable,
)
from tests.upstream_server import Reply, answered_chunks, load_transcript

MODEL = "claude-sonnet-4-5-20250929"
TARGET = RouteTarget(
    upstream_model=MODEL,
    capabilities=frozenset({"tools", "reasoning", "vision"}),
    extra_params=frozenset({"top_k"}),
    max_output_tokens=8192,
)
KEY = "sk-ant-test-secret"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "toolu_01",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def chat(messages=None, **fields):
    return ChatRequest(
        model="claude", messages=messages or [{"role": "user", "content": "Hi"}], **fields
    )


@pytest.fixture
def adapter(replay_server, monkeypatch):
    monkeypatch.setenv("CLAUDE_API_KEY", KEY)
    return AnthropicAdapter(
        UpstreamConfig(
            name="claude",
            kind="anthropic",
            base_url=f"{replay_server.url}/claude",
            api_key_env="CLAUDE_API_KEY",
            read_timeout=5.0,
        )
    )


def deltas(chunks):
    return [choice["delta"] for chunk in chunks for choice in chunk.choices]


def joined(chunks, key):
    return "".join(delta.get(key) or "" for delta in deltas(chunks))


def test_a_conversation_translates_to_system_and_alternating_turns():
    image = "data:image/png;base64,iVBORw0KGgo="
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "And look at these:"},
                {"type": "image_url", "image_url": {"url": image, "detail": "auto"}},
                {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
            ],
        },
        {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "toolu_01", "content": "18 degrees"},
        {"role": "system", "content": [{"type": "text", "text": "Use Celsius."}]},
        {"role": "user", "content": "Thanks!"},
    ]

    body = messages_request(chat(messages, params={"max_tokens": 300}), TARGET)

    assert body["system"] == "Be brief.\n\nUse Celsius."
    assert body["max_tokens"] == 300
    assert body["model"] == MODEL
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather in Paris?"},
                {"type": "text", "text": "And look at these:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
                {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
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
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 degrees"},
                {"type": "text", "text": "Thanks!"},
            ],
        },
    ]
    assert "stream" not in body and "thinking" not in body


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({}, None),
        ({"tool_choice": "auto"}, {"type": "auto"}),
        ({"tool_choice": "none"}, {"type": "none"}),
        ({"tool_choice": "required"}, {"type": "any"}),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            {"type": "tool", "name": "get_weather"},
        ),
        ({"parallel_tool_calls": False}, {"type": "auto", "disable_parallel_tool_use": True}),
        (
            {"tool_choice": "required", "parallel_tool_calls": False},
            {"type": "any", "disable_parallel_tool_use": True},
        ),
    ],
)
def test_tools_and_tool_choice(params, expected):
    body = messages_request(chat(params={"tools": [WEATHER], **params}), TARGET)

    assert body["tools"] == [
        {
            "name": "get_weather",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
            "description": "Current weather of a city.",
        }
    ]
    assert body.get("tool_choice") == expected


def test_sampling_stop_user_and_allowed_extras():
    request = chat(
        params={"temperature": 1.7, "top_p": 0.9, "stop": "END", "user": "u-1", "seed": 3},
        extra={"top_k": 5, "service_tier": "priority"},
        stream=True,
    )

    body = messages_request(request, TARGET)

    assert body["temperature"] == 1  # Anthropic's range ends at 1
    assert body["top_p"] == 0.9
    assert body["stop_sequences"] == ["END"]
    assert body["metadata"] == {"user_id": "u-1"}
    assert body["top_k"] == 5 and "service_tier" not in body and "seed" not in body
    assert body["stream"] is True
    assert body["max_tokens"] == TARGET.max_output_tokens


@pytest.mark.parametrize(
    ("effort", "max_tokens", "budget"),
    [("low", None, 2048), ("medium", None, 6144), ("high", 40_000, 24_576), ("high", 2000, 1500)],
)
def test_reasoning_effort_becomes_a_thinking_budget_below_max_tokens(effort, max_tokens, budget):
    params = {"reasoning_effort": effort, "temperature": 0.5, "top_p": 0.9}
    if max_tokens:
        params["max_tokens"] = max_tokens

    body = messages_request(chat(params=params), TARGET)

    assert body["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert budget < body["max_tokens"]
    assert "temperature" not in body and "top_p" not in body


@pytest.mark.parametrize(
    ("params", "messages", "target"),
    [
        ({"reasoning_effort": "none"}, None, TARGET),
        ({"reasoning_effort": "high", "max_tokens": 1000}, None, TARGET),
        ({"reasoning_effort": "high"}, None, RouteTarget(upstream_model=MODEL)),
        ({"reasoning_effort": "high", "tools": [WEATHER], "tool_choice": "required"}, None, TARGET),
        (
            {"reasoning_effort": "high", "tools": [WEATHER]},
            [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "toolu_01", "content": "18 degrees"},
            ],
            TARGET,
        ),
    ],
    ids=["effort-none", "budget-too-small", "no-reasoning", "forced-tool", "tool-results"],
)
def test_no_thinking_where_the_api_would_refuse_it(params, messages, target):
    body = messages_request(chat(messages, params=params), target)

    assert "thinking" not in body


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (chat(params={"n": 2}), "n"),
        (
            chat(
                [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "ftp://x"}}],
                    }
                ]
            ),
            "messages[0].content[0].image_url.url",
        ),
        (
            chat(
                [
                    {"role": "user", "content": "Hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "[1]"}}],
                    },
                ]
            ),
            "messages[1].tool_calls[0].function.arguments",
        ),
    ],
)
def test_what_the_api_cannot_take_is_rejected_naming_the_param(request_, param):
    with pytest.raises(UpstreamRejected) as caught:
        messages_request(request_, TARGET)

    assert caught.value.param == param


def test_whole_answer_with_cache_reads(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_message"))

    completion = adapter.complete(chat(), TARGET)

    (exchange,) = replay_server.exchanges
    assert exchange.path == "/claude/v1/messages"
    assert exchange.headers["x-api-key"] == KEY
    assert exchange.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in exchange.headers
    assert completion.choices == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "The capital of France is Paris.",
                "refusal": None,
            },
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    usage = completion.usage
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (2069, 2048, 10)


def test_whole_answer_with_thinking_text_and_a_tool_call(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_message_tool_use"))

    completion = adapter.complete(chat(params={"tools": [WEATHER]}), TARGET)

    (choice,) = completion.choices
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["content"] == "I'll check the weather in Paris."
    assert message["reasoning"].startswith("The user wants the weather in Paris.")
    assert message["reasoning_details"] == [
        {
            "type": "reasoning.text",
            "text": message["reasoning"],
            "signature": "RXVJQ2ZEZXN0LW9ubHktc2lnbmF0dXJlLW5vdC1hLXJlYWwtb25l",
            "format": "anthropic-claude-v1",
            "index": 0,
        }
    ]
    (call,) = message["tool_calls"]
    assert (call["id"], call["type"], call["function"]["name"]) == (
        "toolu_01A00000000000000000000a",
        "function",
        "get_weather",
    )
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    usage = completion.usage
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (1436, 0, 96)
    assert 0 < usage.reasoning_tokens < 96


@pytest.mark.parametrize(
    ("transcript", "named"),
    [("anthropic_message_stop_sequence", "END"), ("anthropic_message", None)],
)
def test_a_whole_answer_names_the_stop_sequence_anthropic_says_it_ended_on(
    adapter, replay_server, transcript, named
):
    replay_server.script("/claude", Reply(transcript))

    completion = adapter.complete(chat(params={"stop": ["END"]}), TARGET)

    assert completion.stop_sequence == named
    assert completion.choices[0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    ("transcript", "named"),
    [("anthropic_stream_stop_sequence", "END"), ("anthropic_stream_text", None)],
)
def test_a_stream_names_the_stop_sequence_on_the_chunk_that_finishes(
    adapter, replay_server, transcript, named
):
    replay_server.script("/claude", Reply(transcript))

    chunks = answered_chunks(adapter.stream(chat(stream=True, params={"stop": ["END"]}), TARGET))

    (finishing,) = [
        chunk for chunk in chunks if chunk.choices and chunk.choices[0]["finish_reason"]
    ]
    assert finishing.choices[0]["finish_reason"] == "stop" and finishing.stop_sequence == named
    assert all(chunk.stop_sequence is None for chunk in chunks if chunk is not finishing)


@pytest.mark.parametrize("write_size", [None, 1, 13])
def test_streamed_text_with_pings_then_usage(adapter, replay_server, write_size):
    replay_server.script("/claude", Reply("anthropic_stream_text", write_size=write_size))

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))

    assert deltas(chunks)[0] == {"role": "assistant", "content": ""}
    assert joined(chunks, "content") == "The capital of France is Paris."
    assert chunks[-2].choices[0]["finish_reason"] == "stop"
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (2069, 2048, 10)


def test_streamed_tool_use_becomes_indexed_tool_call_deltas(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_stream_tool_use"))

    chunks = answered_chunks(adapter.stream(chat(stream=True, params={"tools": [WEATHER]}), TARGET))

    calls: dict[int, dict] = {}
    for delta in deltas(chunks):
        for piece in delta.get("tool_calls", ()):
            call = calls.setdefault(piece["index"], {"id": None, "name": "", "arguments": ""})
            call["id"] = piece.get("id") or call["id"]
            call["name"] += piece["function"].get("name") or ""
            call["arguments"] += piece["function"].get("arguments") or ""
    assert calls == {
        0: {
            "id": "toolu_01A00000000000000000000b",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        1: {
            "id": "toolu_01A00000000000000000000c",
            "name": "get_weather",
            "arguments": '{"city": "Rome"}',
        },
    }
    assert joined(chunks, "content") == "I'll check both cities."
    assert chunks[-2].choices[0]["finish_reason"] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == 89


def test_streamed_thinking_becomes_reasoning_with_its_signature(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_stream_thinking", write_size=9))

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))

    assert joined(chunks, "reasoning") == (
        "Compare 9.11 and 9.8 as decimals: 9.80 > 9.11, so 9.8 is greater."
    )
    details = [d for delta in deltas(chunks) for d in delta.get("reasoning_details", ())]
    assert details == [
        {
            "type": "reasoning.text",
            "signature": "RXVJQ2ZEZXN0LW9ubHktc2lnbmF0dXJlLW5vdC1hLXJlYWwtb25lLTI=",
            "format": "anthropic-claude-v1",
            "index": 0,
        }
    ]
    assert joined(chunks, "content") == "9.8 is greater than 9.11."
    usage = chunks[-1].usage
    assert usage.completion_tokens == 61 and 0 < usage.reasoning_tokens < 61


def test_an_overloaded_error_event_mid_stream(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_stream_error"))
    received = []

    with pytest.raises(UpstreamUnavailable):
        for chunk in adapter.stream(chat(stream=True), TARGET):
            received.append(chunk)

    assert joined(received, "content") == "Once upon a time"


def test_a_stream_cut_before_message_stop_fails(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_stream_text", close_after_events=5))

    with pytest.raises(UpstreamError):
        list(adapter.stream(chat(stream=True), TARGET))


@pytest.mark.parametrize(
    ("transcript", "error_class"),
    [("anthropic_error_401", UpstreamMisconfigured), ("anthropic_error_529", UpstreamUnavailable)],
)
def test_error_statuses_reveal_nothing(adapter, replay_server, transcript, error_class):
    replay_server.script("/claude", Reply(transcript))

    with pytest.raises(UpstreamError) as caught:
        adapter.complete(chat(), TARGET)

    assert type(caught.value) is error_class
    assert "x-api-key" not in caught.value.message and "Overloaded" not in caught.value.message


def test_a_rejection_passes_on_with_the_public_model_name(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_error_400"))

    with pytest.raises(UpstreamRejected) as caught:
        adapter.complete(chat(), TARGET)

    assert caught.value.message == (
        "max_tokens: 64001 > 64000, which is the maximum allowed number of output tokens for claude"
    )


def test_closing_a_stream_closes_the_upstream_connection_at_once(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_stream_text", repeat_event=4, pause=0.02))
    chunks = adapter.stream(chat(stream=True), TARGET)
    for _ in range(4):
        next(chunks)

    closed = time.monotonic()
    chunks.close()

    (exchange,) = replay_server.exchanges
    assert exchange.answered.wait(2)
    assert exchange.client_closed_at is not None
    assert exchange.client_closed_at - closed < 0.5


def test_prompt_estimates_run_above_cl100k_counts(adapter):
    request = chat([{"role": "user", "content": "Explain the theory of relativity. " * 50}])

    assert adapter.count_prompt_tokens(request, TARGET) > 50 * 7


def test_answers_and_every_chunk_carry_a_string_system_fingerprint(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_message"), Reply("anthropic_stream_text"))

    completion = adapter.complete(chat(), TARGET)
    chunks = list(adapter.stream(chat(stream=True), TARGET))

    fingerprint = completion.system_fingerprint
    assert isinstance(fingerprint, str) and fingerprint.startswith("fp_")
    assert {chunk.system_fingerprint for chunk in chunks} == {fingerprint}
    assert MODEL not in fingerprint and "claude" not in fingerprint


def test_chunks_say_more_until_their_read_ends(adapter, replay_server):
    # Events 0-7 (message_start ... content_block_stop) in one write, then the last two.
    reply = Reply("anthropic_stream_text", together=True, stall_after_events=8, stall_seconds=0.2)
    replay_server.script("/claude", reply)

    chunks = list(adapter.stream(chat(stream=True), TARGET))

    # message_start, four text deltas; content_block_stop ended the read: an empty chunk
    # stands for it; then the finish (message_stop follows it) and the usage.
    assert [chunk.more for chunk in chunks] == [True] * 5 + [False, True, False]
    assert (chunks[5].choices, chunks[5].usage) == ([], None)
    assert joined(chunks, "content") == "The capital of France is Paris."
    assert chunks[-1].usage is not None


def test_a_message_passed_through_keeps_the_callers_body_and_headers(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_message"))
    body = {
        "model": "claude",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "context_management": {"edits": []},
    }
    call = NativeCall(
        api="messages",
        body=body,
        headers={"anthropic-version": "2099-01-01", "anthropic-beta": "b1,b2", "x-app": "cli"},
    )

    answer = adapter.relay(call, RouteTarget(upstream_model="claude-test-1"))

    (exchange,) = replay_server.exchanges
    assert exchange.path == "/claude/v1/messages"
    assert exchange.json == {**body, "model": "claude-test-1"}
    assert exchange.headers["anthropic-version"] == "2099-01-01"
    assert exchange.headers["anthropic-beta"] == "b1,b2"
    assert exchange.headers["x-api-key"] == KEY and "x-app" not in exchange.headers
    assert answer.body == load_transcript("anthropic_message")[1]
    assert answer.decoded["usage"]["cache_creation_input_tokens"] >= 0


def test_a_stream_passed_through_arrives_byte_for_byte(adapter, replay_server):
    replay_server.script("/claude", Reply("anthropic_stream_thinking", write_size=9))
    call = NativeCall(api="messages", body={"model": "claude", "stream": True}, stream=True)

    received = b"".join(adapter.relay_stream(call, RouteTarget(upstream_model="claude-test-1")))

    # The thinking block's signature and every event, exactly as the upstream sent them.
    assert received == load_transcript("anthropic_stream_thinking")[1]
    assert b"signature_delta" in received


def test_cache_writes_without_their_ttl_breakdown_are_five_minute_ones():
    usage = usage_from({"input_tokens": 10, "cache_creation_input_tokens": 300})
    assert (usage.prompt_tokens, usage.cache_write_tokens, usage.cache_write_1h_tokens) == (
        310,
        300,
        0,
    )


def test_usage_reads_cache_writes_by_ttl_server_tool_calls_and_the_tier():
    raw = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 300,
        "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
        "output_tokens": 5,
        "server_tool_use": {"web_search_requests": 2, "web_fetch_requests": 1},
        "service_tier": "priority",
    }
    blocks = [
        {"type": "server_tool_use", "name": "web_search", "id": "s1", "input": {}},
        {"type": "server_tool_use", "name": "bash_code_execution", "id": "s2", "input": {}},
        {"type": "server_tool_use", "name": "text_editor_code_execution", "id": "s3"},
        {"type": "mcp_tool_use", "name": "lookup", "server_name": "docs", "id": "m1"},
        {"type": "text", "text": "Done."},
    ]
    usage = usage_from(raw, counted=counted_calls(blocks, {"id": "container_1"}))
    assert (usage.cache_write_tokens, usage.cache_write_1h_tokens) == (300, 200)
    # Web searches and fetches as the usage counts them, not by their blocks.
    assert usage.tool_calls == {
        "web_search": 2,
        "web_fetch": 1,
        "code_execution": 2,
        "mcp": 1,
        "container": 1,
    }
    assert usage.service_tier == "priority"
    assert usage_from({"input_tokens": 1}).tool_calls is None
