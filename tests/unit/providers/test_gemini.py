"""GeminiAdapter: the translation both ways, and the adapter against replayed transcripts."""

from __future__ import annotations

import json

import pytest

from app.providers.base import (
    ChatRequest,
    EmbeddingRequest,
    NativeCall,
    RouteTarget,
    UpstreamConfig,
    Usage,
)
from app.providers.errors import (
    UpstreamError,
    UpstreamMisconfigured,
    UpstreamRejected,
    UpstreamUnavailable,
)
from app.providers.event_stream import ServerSentEvent
from app.providers.gemini import (
    MADE_UP_ID_PREFIX,
    SKIPPED_SIGNATURE,
    GeminiAdapter,
    StreamTranslation,
    embedding_vectors,
    generate_request,
    usage_from,
)
from tests.upstream_server import Reply, answered_chunks, load_transcript

MODEL = "gemini-2.5-flash"
TARGET = RouteTarget(
    upstream_model=MODEL,
    capabilities=frozenset({"tools", "reasoning", "vision", "json_schema"}),
    extra_params=frozenset({"safetySettings"}),
    max_output_tokens=8192,
)
KEY = "AIzaSy-test-only-gemini-key-000000000"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "additionalProperties": False,
        },
    },
}


def chat(messages=None, **fields):
    return ChatRequest(
        model="gemini", messages=messages or [{"role": "user", "content": "Hi"}], **fields
    )


@pytest.fixture
def adapter(replay_server, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    return GeminiAdapter(
        UpstreamConfig(
            name="google",
            kind="gemini",
            base_url=f"{replay_server.url}/google",
            api_key_env="GEMINI_API_KEY",
            read_timeout=5.0,
        )
    )


def deltas(chunks):
    return [choice["delta"] for chunk in chunks for choice in chunk.choices]


def joined(chunks, key):
    return "".join(delta.get(key) or "" for delta in deltas(chunks))


def test_a_conversation_translates_to_contents_a_system_instruction_and_function_parts():
    image = "data:image/png;base64,iVBORw0KGgo="
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather here?"},
                {"type": "image_url", "image_url": {"url": image}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a/sky.jpg?s=1"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"{MADE_UP_ID_PREFIX}0001",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "gm-own-id",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": ""},
                },
            ],
        },
        {"role": "tool", "tool_call_id": f"{MADE_UP_ID_PREFIX}0001", "content": "18 C"},
        {"role": "tool", "tool_call_id": "gm-own-id", "content": [{"type": "text", "text": "9h"}]},
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Merci"},
    ]

    body = generate_request(chat(messages), TARGET)

    assert body["systemInstruction"] == {"parts": [{"text": "Be brief.\n\nAnswer in French."}]}
    assert body["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "Weather here?"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
                {
                    "fileData": {
                        "fileUri": "https://example.com/a/sky.jpg?s=1",
                        "mimeType": "image/jpeg",
                    }
                },
            ],
        },
        {
            "role": "model",
            "parts": [
                # The call's own signature is not at hand: Google's documented stand-in.
                {
                    "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                    "thoughtSignature": SKIPPED_SIGNATURE,
                },
                {"functionCall": {"name": "get_time", "args": {}, "id": "gm-own-id"}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "get_weather", "response": {"result": "18 C"}}},
                {
                    "functionResponse": {
                        "name": "get_time",
                        "response": {"result": "9h"},
                        "id": "gm-own-id",
                    }
                },
                {"text": "Merci"},
            ],
        },
    ]
    assert "model" not in body


def test_tools_sampling_stops_json_output_and_thinking_go_in_their_fields():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}}
    request = chat(
        params={
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 4000,
            "temperature": 0.3,
            "top_p": 0.9,
            "seed": 7,
            "stop": "END",
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema},
            },
            "reasoning_effort": "high",
        },
        extra={"safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT"}], "other": 1},
    )

    body = generate_request(request, TARGET)

    assert body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Current weather of a city.",
                    "parametersJsonSchema": WEATHER["function"]["parameters"],
                }
            ]
        }
    ]
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    assert body["generationConfig"] == {
        "maxOutputTokens": 4000,
        "temperature": 0.3,
        "topP": 0.9,
        "seed": 7,
        "stopSequences": ["END"],
        "responseMimeType": "application/json",
        "responseJsonSchema": schema,
        # High's 24576 thinking tokens, capped at three quarters of the output limit.
        "thinkingConfig": {"thinkingBudget": 3000, "includeThoughts": True},
    }
    assert body["safetySettings"] == [{"category": "HARM_CATEGORY_HARASSMENT"}]
    assert "other" not in body


@pytest.mark.parametrize(
    ("choice", "mode"), [("none", "NONE"), ("auto", "AUTO"), ("required", "ANY")]
)
def test_tool_choice_becomes_a_function_calling_mode(choice, mode):
    body = generate_request(chat(params={"tools": [WEATHER], "tool_choice": choice}), TARGET)
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": mode}}


def test_reasoning_none_turns_thinking_off_and_a_model_without_reasoning_is_sent_none():
    off = generate_request(chat(params={"reasoning_effort": "none"}), TARGET)
    assert off["generationConfig"]["thinkingConfig"] == {"thinkingBudget": 0}
    plain = RouteTarget(upstream_model=MODEL, max_output_tokens=100)
    body = generate_request(chat(params={"reasoning_effort": "high"}), plain)
    assert body["generationConfig"] == {"maxOutputTokens": 100}


def test_several_choices_and_an_unreadable_image_are_refused_before_sending():
    with pytest.raises(UpstreamRejected) as caught:
        generate_request(chat(params={"n": 2}), TARGET)
    assert caught.value.param == "n"
    image = {"type": "image_url", "image_url": {"url": "ftp://example.com/a.png"}}
    with pytest.raises(UpstreamRejected) as caught:
        generate_request(chat([{"role": "user", "content": [image]}]), TARGET)
    assert caught.value.param == "messages[0].content[0].image_url.url"


def test_usage_bills_cache_reads_thoughts_and_tool_use_prompts():
    usage = usage_from(
        {
            "promptTokenCount": 2100,
            "cachedContentTokenCount": 2048,
            "toolUsePromptTokenCount": 40,
            "candidatesTokenCount": 8,
            "thoughtsTokenCount": 180,
            "totalTokenCount": 2368,
        }
    )
    assert usage == Usage(
        prompt_tokens=2140, completion_tokens=188, cached_tokens=2048, reasoning_tokens=180
    )
    assert usage_from(None) == Usage()


def test_a_whole_answer_reads_its_text_and_usage(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_generate"))

    completion = adapter.complete(chat(), TARGET)

    (exchange,) = replay_server.exchanges
    assert exchange.path == f"/google/v1beta/models/{MODEL}:generateContent"
    assert exchange.headers["x-goog-api-key"] == KEY
    assert "authorization" not in exchange.headers and "key=" not in exchange.path
    assert exchange.json["contents"] == [{"role": "user", "parts": [{"text": "Hi"}]}]
    (choice,) = completion.choices
    assert choice["message"]["content"] == "The capital of France is Paris."
    assert choice["finish_reason"] == "stop"
    assert completion.usage == Usage(
        prompt_tokens=2100, completion_tokens=188, cached_tokens=2048, reasoning_tokens=180
    )
    assert completion.system_fingerprint.startswith("fp_")


def test_function_calls_get_ids_and_a_thought_keeps_its_summary(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_generate_tool_call"))

    completion = adapter.complete(chat(params={"tools": [WEATHER]}), TARGET)

    (choice,) = completion.choices
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    calls = message["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome"}),
    ]
    assert all(call["id"].startswith(MADE_UP_ID_PREFIX) for call in calls)
    assert calls[0]["id"] != calls[1]["id"]
    assert message["reasoning"].startswith("**Checking the weather**")
    assert message["reasoning_details"][0]["format"] == "google-gemini-v1"
    assert (completion.usage.completion_tokens, completion.usage.reasoning_tokens) == (246, 212)


@pytest.mark.parametrize(
    ("transcript", "finish_reason", "prompt_tokens"),
    [
        ("gemini_generate_max_tokens", "length", 8),
        ("gemini_generate_blocked", "content_filter", 12),
    ],
)
def test_a_cut_or_blocked_answer_says_why(
    adapter, replay_server, transcript, finish_reason, prompt_tokens
):
    replay_server.script("/google", Reply(transcript))

    completion = adapter.complete(chat(), TARGET)

    assert completion.choices[0]["finish_reason"] == finish_reason
    assert completion.usage.prompt_tokens == prompt_tokens


def test_a_stream_relays_thoughts_text_and_the_final_usage(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_stream", write_size=7))

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))

    (exchange,) = replay_server.exchanges
    assert exchange.path == f"/google/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    assert deltas(chunks)[0]["role"] == "assistant"
    assert joined(chunks, "reasoning") == "**Comparing decimals**\n\n9.80 against 9.11."
    assert joined(chunks, "content") == "9.8 is greater than 9.11."
    finishes = [c["finish_reason"] for chunk in chunks for c in chunk.choices if c["finish_reason"]]
    assert finishes == ["stop"]
    # Every chunk carries the usage so far: the prompt's, from the first event on.
    assert chunks[0].usage.prompt_tokens == 2100
    assert chunks[-1].choices == [] and chunks[-1].usage == Usage(
        prompt_tokens=2100, completion_tokens=249, cached_tokens=2048, reasoning_tokens=240
    )


def test_a_streamed_function_call_comes_whole_with_an_id(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_stream_tool_call", write_size=11))

    chunks = answered_chunks(adapter.stream(chat(stream=True, params={"tools": [WEATHER]}), TARGET))

    calls = [call for delta in deltas(chunks) for call in delta.get("tool_calls") or ()]
    assert len(calls) == 1 and calls[0]["index"] == 0
    assert calls[0]["id"].startswith(MADE_UP_ID_PREFIX)
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    finishes = [c["finish_reason"] for chunk in chunks for c in chunk.choices if c["finish_reason"]]
    assert finishes == ["tool_calls"]
    assert chunks[-1].usage == Usage(prompt_tokens=96, completion_tokens=168, reasoning_tokens=150)


def test_an_error_in_place_of_the_next_event_ends_the_stream(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_stream_error"))
    received = []

    with pytest.raises(UpstreamUnavailable):
        for chunk in adapter.stream(chat(stream=True), TARGET):
            received.append(chunk)

    assert joined(received, "content") == "Once upon a time"


def test_a_stream_that_ends_before_its_finish_reason_failed(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_stream", close_after_events=2))

    with pytest.raises(UpstreamError):
        list(adapter.stream(chat(stream=True), TARGET))


@pytest.mark.parametrize(
    ("transcript", "error", "retry_after"),
    [
        ("gemini_error_429", UpstreamUnavailable, 37.0),
        ("gemini_error_503", UpstreamUnavailable, None),
        ("gemini_error_500", UpstreamError, None),
        ("gemini_error_400_key", UpstreamMisconfigured, None),
    ],
)
def test_googles_errors_map_to_the_gateways(adapter, replay_server, transcript, error, retry_after):
    replay_server.script("/google", Reply(transcript))

    with pytest.raises(error) as caught:
        adapter.complete(chat(), TARGET)

    assert type(caught.value) is error
    assert caught.value.retry_after == retry_after
    assert KEY not in str(caught.value.message)


def test_a_refusal_is_passed_on_with_the_public_model_name(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_error_400"), Reply("gemini_error_400"))

    with pytest.raises(UpstreamRejected) as caught:
        adapter.complete(chat(), TARGET)
    with pytest.raises(UpstreamRejected) as streamed:
        list(adapter.stream(chat(stream=True), TARGET))

    for error in (caught.value, streamed.value):
        assert "at most 5 stop sequences" in error.message
        assert MODEL not in error.message and "models/gemini" in error.message


def test_a_gemini_request_passed_through_goes_as_sent_to_the_routes_model(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_generate"))
    signature = "CiQB0e2Kb3Rlc3Qtb25seS1zaWduYXR1cmUtbm90LWEtcmVhbC1vbmUK/+=="
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "Weather?"}]},
            {
                "role": "model",
                "parts": [
                    {
                        "functionCall": {"name": "get_weather", "args": {}},
                        "thoughtSignature": signature,
                    }
                ],
            },
        ],
        "generationConfig": {"thinkingConfig": {"thinkingLevel": "LOW"}},
        "cachedContent": "cachedContents/abc",
    }

    answer = adapter.relay(NativeCall(api="gemini", body=body, model="gemini-pro"), TARGET)

    (exchange,) = replay_server.exchanges
    assert exchange.path == f"/google/v1beta/models/{MODEL}:generateContent"
    assert exchange.json == body and exchange.headers["x-goog-api-key"] == KEY
    assert b'"thoughtSignature":"%s"' % signature.encode() in exchange.body
    assert answer.body == load_transcript("gemini_generate")[1]
    assert usage_from(answer.decoded["usageMetadata"]).cached_tokens == 2048


def test_a_gemini_stream_passed_through_arrives_byte_for_byte(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_stream_tool_call", write_size=9))
    call = NativeCall(api="gemini", body={"contents": []}, stream=True, model="gemini-pro")

    received = b"".join(adapter.relay_stream(call, TARGET))

    (exchange,) = replay_server.exchanges
    assert exchange.path == f"/google/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"
    assert received == load_transcript("gemini_stream_tool_call")[1]


def test_a_passed_through_refusal_names_the_callers_model(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_error_400"))
    call = NativeCall(api="gemini", body={"contents": []}, model="gemini-pro")

    with pytest.raises(UpstreamRejected) as caught:
        adapter.relay(call, TARGET)

    assert "models/gemini-pro" in caught.value.message


def test_a_model_named_with_its_collection_keeps_it(replay_server, monkeypatch):
    adapter = GeminiAdapter(
        UpstreamConfig(name="google", kind="gemini", base_url=f"{replay_server.url}/google/")
    )
    replay_server.script("/google", Reply("gemini_generate"))

    adapter.complete(chat(), RouteTarget(upstream_model="tunedModels/weather-1"))

    (exchange,) = replay_server.exchanges
    assert exchange.path == "/google/v1beta/tunedModels/weather-1:generateContent"
    assert "x-goog-api-key" not in exchange.headers


def test_an_answer_without_usage_is_billed_at_its_counted_tokens(adapter, replay_server):
    replay_server.script("/google", Reply("gemini_generate_no_usage"))

    completion = adapter.complete(chat(), TARGET)

    usage = completion.usage
    assert usage.estimated and usage.prompt_tokens > 0
    assert usage.completion_tokens == adapter.count_text_tokens(
        "The capital of France is Paris.", TARGET
    )


def test_a_stream_chunk_carries_no_usage_before_gemini_reports_one():
    translation = StreamTranslation("fp_test")
    part = {"candidates": [{"content": {"parts": [{"text": "Hi"}], "role": "model"}}]}
    counted = {**part, "usageMetadata": {"promptTokenCount": 12, "totalTokenCount": 12}}

    first = translation.relay(ServerSentEvent("message", json.dumps(part)))
    second = translation.relay(ServerSentEvent("message", json.dumps(counted)))
    third = translation.relay(ServerSentEvent("message", json.dumps(part)))

    # A usage of nothing would bill a stream cut now below its prompt: none is sent instead.
    assert first.usage is None and first.choices[0]["delta"]["content"] == "Hi"
    assert second.usage.prompt_tokens == third.usage.prompt_tokens == 12


def test_an_output_limit_too_small_for_any_thinking_budget_leaves_the_models_default():
    body = generate_request(chat(params={"reasoning_effort": "low", "max_tokens": 150}), TARGET)
    assert body["generationConfig"] == {"maxOutputTokens": 150}
    body = generate_request(chat(params={"reasoning_effort": "low", "max_tokens": 200}), TARGET)
    assert body["generationConfig"]["thinkingConfig"]["thinkingBudget"] == 150


def test_an_embedding_answer_is_read_only_with_one_vector_of_numbers_per_input():
    two = [{"values": [0.5, -0.25]}, {"values": [1.0, 0.0]}]

    assert [vector.as_floats() for vector in embedding_vectors(two, 2)] == [
        [0.5, -0.25],
        [1.0, 0.0],
    ]
    for answer in (two[:1], None, [{"values": "AAAA"}, two[1]], [{}, two[1]], [[0.5], two[1]]):
        with pytest.raises(UpstreamError):
            embedding_vectors(answer, 2)


def test_token_ids_are_refused_before_google_is_called(adapter, replay_server):
    request = EmbeddingRequest(model="gemini-embedding", inputs=[[1, 2, 3]])

    with pytest.raises(UpstreamRejected, match="not token ids"):
        adapter.embed(request, TARGET)
    assert replay_server.exchanges == []
