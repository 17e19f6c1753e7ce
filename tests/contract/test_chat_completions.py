"""The gateway as users call it: the official openai SDK, over real HTTP, through gunicorn."""

from __future__ import annotations

import json
from decimal import Decimal

import jsonschema
import pytest
import requests

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
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}


def test_models_list_shows_the_enabled_catalog(sdk):
    models = {model.id: model for model in sdk.models.list()}
    assert {"dev-chat", "dev-chat-mini", "dev-slow", "dev-dying"} <= set(models)
    assert "dev-hidden" not in models
    entry = models["dev-chat"].model_dump()
    assert entry["object"] == "model" and entry["owned_by"] == "builtin"
    assert entry["pricing"]["completion"] == 1.5


def test_completion_answers_with_usage_and_cost(sdk):
    response = sdk.chat.completions.create(
        model="dev-chat-mini", messages=[{"role": "user", "content": "Hello there"}], seed=7
    )
    assert response.object == "chat.completion"
    assert response.model == "dev-chat-mini"
    assert response.id.startswith("chatcmpl-")
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.startswith("Hello there")
    assert choice.finish_reason == "stop"
    usage = response.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    expected = (
        Decimal(usage.prompt_tokens) * Decimal("0.15")
        + Decimal(usage.completion_tokens) * Decimal("0.60")
    ) / 1_000_000
    assert Decimal(str(usage.model_extra["cost"]["total_cost"])) == expected


def test_streaming_delivers_the_same_answer_token_by_token(sdk):
    kwargs = {
        "model": "dev-chat-mini",
        "messages": [{"role": "user", "content": "Stream me"}],
        "seed": 3,
    }
    whole = sdk.chat.completions.create(**kwargs)
    chunks = list(
        sdk.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(
        chunk.object == "chat.completion.chunk" and chunk.model == "dev-chat-mini"
        for chunk in chunks
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == whole.usage.completion_tokens
    assert (
        last.usage.model_extra["cost"]["total_cost"]
        == whole.usage.model_extra["cost"]["total_cost"]
    )


def test_streaming_without_include_usage_sends_no_usage(sdk):
    chunks = list(
        sdk.chat.completions.create(
            model="dev-chat-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
    )
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)


def test_stop_max_tokens_and_n(sdk):
    stopped = sdk.chat.completions.create(
        model="dev-chat",
        messages=[{"role": "user", "content": "one two STOP three"}],
        stop=["STOP"],
    )
    assert stopped.choices[0].message.content == "one two "
    assert stopped.choices[0].finish_reason == "stop"
    cut = sdk.chat.completions.create(
        model="dev-chat",
        messages=[{"role": "user", "content": "alpha beta gamma delta"}],
        max_completion_tokens=2,
        reasoning_effort="none",
    )
    assert cut.choices[0].message.content == "alpha beta"
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 2
    many = sdk.chat.completions.create(
        model="dev-chat-mini", messages=[{"role": "user", "content": "x"}], n=3, temperature=1
    )
    assert [c.index for c in many.choices] == [0, 1, 2]


def test_seed_makes_answers_repeatable(sdk):
    def ask(seed):
        return (
            sdk.chat.completions.create(
                model="dev-chat-mini",
                messages=[{"role": "user", "content": "tell"}],
                seed=seed,
                temperature=1,
            )
            .choices[0]
            .message.content
        )

    assert ask(11) == ask(11)
    assert ask(11) != ask(12)


def test_tool_calls_validate_against_their_schema(sdk):
    response = sdk.chat.completions.create(
        model="dev-chat",
        messages=[{"role": "user", "content": "use get_weather and get_time please"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert [call.function.name for call in calls] == ["get_weather", "get_time"]
    jsonschema.validate(
        json.loads(calls[0].function.arguments), WEATHER_TOOL["function"]["parameters"]
    )

    single = sdk.chat.completions.create(
        model="dev-chat",
        messages=[{"role": "user", "content": "use get_weather and get_time please"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
        parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert [c.function.name for c in single.choices[0].message.tool_calls] == ["get_time"]

    answered = sdk.chat.completions.create(
        model="dev-chat",
        messages=[
            {"role": "user", "content": "use get_weather"},
            {"role": "assistant", "tool_calls": [call.model_dump() for call in calls[:1]]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
        ],
        tools=[WEATHER_TOOL],
    )
    assert answered.choices[0].message.content == "Tool result received: sunny"


def test_streamed_tool_calls_carry_indexes_and_reassemble(sdk):
    stream = sdk.chat.completions.create(
        model="dev-chat",
        messages=[{"role": "user", "content": "call get_weather"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        stream=True,
    )
    arguments, names = {}, {}
    for chunk in stream:
        for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            assert call.index is not None
            if call.function.name:
                names[call.index] = call.function.name
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    assert names == {0: "get_weather"}
    jsonschema.validate(json.loads(arguments[0]), WEATHER_TOOL["function"]["parameters"])


def test_json_output_parses_and_validates(sdk):
    plain = sdk.chat.completions.create(
        model="dev-chat-mini",
        messages=[{"role": "user", "content": "as json"}],
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(plain.choices[0].message.content), dict)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    shaped = sdk.chat.completions.create(
        model="dev-chat-mini",
        messages=[{"role": "user", "content": "a person"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        },
    )
    jsonschema.validate(json.loads(shaped.choices[0].message.content), schema)


@pytest.mark.parametrize(
    ("effort", "has_reasoning"), [("high", True), ("low", True), ("none", False)]
)
def test_reasoning_trace_details_and_tokens(sdk, effort, has_reasoning):
    response = sdk.chat.completions.create(
        model="dev-chat", messages=[{"role": "user", "content": "think"}], reasoning_effort=effort
    )
    message = response.choices[0].message.model_dump()
    details = response.usage.completion_tokens_details
    if has_reasoning:
        assert message["reasoning"]
        assert message["reasoning_details"][0]["text"] == message["reasoning"]
        assert 0 < details.reasoning_tokens < response.usage.completion_tokens
    else:
        assert not message.get("reasoning")
        assert details.reasoning_tokens == 0


def test_streamed_reasoning_deltas(sdk):
    chunks = list(
        sdk.chat.completions.create(
            model="dev-chat",
            messages=[{"role": "user", "content": "think"}],
            reasoning_effort="low",
            stream=True,
        )
    )
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning") or "" for c in chunks
    )
    assert reasoning


def test_logprobs(sdk):
    response = sdk.chat.completions.create(
        model="dev-chat-mini",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        top_logprobs=2,
    )
    content = response.choices[0].logprobs.content
    assert "".join(entry.token for entry in content) == response.choices[0].message.content
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)


def test_images_count_as_image_tokens_on_a_vision_model(sdk):
    image = {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
    }
    response = sdk.chat.completions.create(
        model="dev-chat",
        messages=[{"role": "user", "content": [{"type": "text", "text": "what is this"}, image]}],
    )
    assert response.usage.prompt_tokens_details.model_dump()["image_tokens"] == 85


def test_a_repeated_prompt_prefix_is_reported_as_cached(sdk):
    system = {"role": "system", "content": "You are a careful assistant. " * 12}
    first = sdk.chat.completions.create(
        model="dev-chat-mini", messages=[system, {"role": "user", "content": "first question"}]
    )
    second = sdk.chat.completions.create(
        model="dev-chat-mini", messages=[system, {"role": "user", "content": "second question"}]
    )
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0
    usage = second.usage
    expected = (
        Decimal(usage.prompt_tokens - cached) * Decimal("0.15")
        + Decimal(cached) * Decimal("0.075")
        + Decimal(usage.completion_tokens) * Decimal("0.60")
    ) / 1_000_000
    assert Decimal(str(usage.model_extra["cost"]["total_cost"])) == expected


def test_streams_are_sent_unbuffered_as_server_sent_events(live_server, funded_key):
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        json={
            "model": "dev-chat-mini",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
        },
        stream=True,
        timeout=30,
    )
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["Cache-Control"] == "no-cache"
    assert response.headers["X-Accel-Buffering"] == "no"
    assert "Content-Length" not in response.headers
    events = response.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(event.startswith("data: ") for event in events[:-1])
