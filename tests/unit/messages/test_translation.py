"""The Messages door's translation: Anthropic's request to the normalized one, and back."""

from __future__ import annotations

import json
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

from app.catalog.registry import load_catalog
from app.errors import InvalidRequest
from app.generations.lifecycle import Answer, StreamEnd
from app.messages.schemas import parse_messages_request
from app.messages.translation import (
    StreamTranslation,
    chat_request,
    message_of,
    signature_of,
    thinking_omitted,
)
from app.providers.base import Chunk, Completion, Usage
from tests.conftest import TEST_CATALOG

CATALOG = load_catalog(TEST_CATALOG)
DEV_CHAT = CATALOG.resolve("dev-chat")
WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHAT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": WEATHER["input_schema"],
        "description": "Current weather",
    },
}


def translate(**fields: Any):
    body = {"model": "dev-chat", "max_tokens": 100, "messages": [{"role": "user", "content": "Hi"}]}
    body.update(fields)
    return chat_request(parse_messages_request(body), DEV_CHAT)


def test_claude_codes_32000_max_tokens_is_clamped_to_the_models_limit():
    assert translate(max_tokens=32000).params["max_tokens"] == DEV_CHAT.max_output_tokens == 4096
    assert translate(max_tokens=300).params["max_tokens"] == 300


def test_system_prompt_and_system_turns_stay_system_messages_where_they_stand():
    request = translate(
        system=[{"type": "text", "text": "First."}, {"type": "text", "text": "Second."}],
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": [{"type": "text", "text": "Tools: get_weather."}]},
        ],
    )

    assert request.messages == [
        {"role": "system", "content": "First.\n\nSecond."},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Tools: get_weather."},
    ]


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages_thinking_left_out():
    request = translate(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should call it.", "signature": "sig=="},
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
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
                        "tool_use_id": "toolu_1",
                        "content": "18 C",
                        "is_error": False,
                    },
                    {"type": "text", "text": "And Rome?"},
                ],
            },
        ],
    )

    assert request.messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "user", "content": [{"type": "text", "text": "And Rome?"}]},
    ]
    assert request.params["tools"] == [CHAT_WEATHER]


def test_images_and_text_documents_become_parts_and_a_pdf_is_refused():
    png = {"type": "base64", "media_type": "image/png", "data": "iVBO"}
    request = translate(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": png},
                    {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/plain", "data": "Notes"},
                    },
                    {"type": "web_search_tool_result", "tool_use_id": "s", "content": []},
                ],
            }
        ]
    )

    assert request.messages[0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}},
        {"type": "text", "text": "Notes"},
    ]
    pdf = {"type": "base64", "media_type": "application/pdf", "data": "JVBE"}
    with pytest.raises(InvalidRequest) as caught:
        translate(messages=[{"role": "user", "content": [{"type": "document", "source": pdf}]}])
    assert caught.value.param == "messages[0].content[0]"


def test_only_tools_defined_by_a_schema_are_offered():
    request = translate(
        tools=[
            WEATHER,
            {**WEATHER, "name": "deferred", "defer_loading": True},
            {"type": "web_search_20250305", "name": "web_search"},
            {"type": "bash_20250124", "name": "bash"},
        ],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )

    assert request.params["tools"] == [CHAT_WEATHER]
    assert request.params["tool_choice"] == "required"
    assert request.params["parallel_tool_calls"] is False


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "none"}, "none"),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice_maps_onto_chats(choice, expected):
    assert translate(tools=[WEATHER], tool_choice=choice).params["tool_choice"] == expected


def test_a_tool_choice_without_an_offered_tool_is_dropped_or_refused():
    server_only = [{"type": "web_search_20250305", "name": "web_search"}]
    assert "tool_choice" not in translate(tools=server_only, tool_choice={"type": "any"}).params
    with pytest.raises(InvalidRequest) as caught:
        translate(tools=server_only, tool_choice={"type": "tool", "name": "web_search"})
    assert caught.value.param == "tool_choice.name"


@pytest.mark.parametrize(
    ("fields", "effort"),
    [
        ({}, None),
        ({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}}, "none"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, "high"),
        ({"thinking": {"type": "adaptive"}}, "medium"),
        ({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "low"),
        ({"max_tokens": 9000, "thinking": {"type": "enabled", "budget_tokens": 8000}}, "medium"),
        ({"max_tokens": 32000, "thinking": {"type": "enabled", "budget_tokens": 31999}}, "high"),
        ({"output_config": {"effort": "low"}}, "low"),
    ],
)
def test_thinking_and_effort_become_the_reasoning_effort(fields, effort):
    assert translate(**fields).params.get("reasoning_effort") == effort


def test_a_model_that_does_not_reason_is_asked_for_no_reasoning_effort():
    body = {
        "model": "dev-chat-mini",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
    }

    request = chat_request(parse_messages_request(body), CATALOG.resolve("dev-chat-mini"))

    assert "reasoning_effort" not in request.params


def test_sampling_stops_user_top_k_and_output_format():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    request = translate(
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
        output_config={"format": {"type": "json_schema", "schema": schema}},
        unknown_field=1,
    )

    assert request.params == {
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["END"],
        "user": "u-1",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": schema},
        },
        "max_tokens": 100,
    }
    assert request.extra == {"unknown_field": 1, "top_k": 40}


def test_a_conversation_with_nothing_to_answer_is_refused():
    with pytest.raises(InvalidRequest):
        translate(messages=[{"role": "system", "content": "Only instructions."}])


def generation(prompt_tokens: int = 9, exact: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        id="msg_1", model=DEV_CHAT, prompt_tokens=prompt_tokens, prompt_tokens_exact=exact
    )


def test_a_whole_answer_becomes_thinking_text_and_tool_use_blocks():
    message = {
        "role": "assistant",
        "content": "Checking.",
        "reasoning": "Hmm.",
        "reasoning_details": [{"type": "reasoning.text", "text": "Hmm.", "format": "builtin-v1"}],
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": '{"a": 1}'},
            },
            {"type": "function", "function": {"name": "g", "arguments": '{"a'}},
        ],
    }
    usage = Usage(
        prompt_tokens=30,
        completion_tokens=12,
        cached_tokens=8,
        cache_write_tokens=5,
        reasoning_tokens=3,
    )
    completion = Completion(
        [{"index": 0, "message": message, "finish_reason": "tool_calls"}], usage
    )

    body = message_of(generation(), Answer(completion, Decimal("0.25")), omitted=False)

    assert body["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": signature_of("Hmm.")},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": body["content"][3]["id"], "name": "g", "input": {}},
    ]
    assert body["content"][3]["id"].startswith("toolu_")  # its upstream sent no id
    assert (body["id"], body["model"], body["stop_reason"]) == ("msg_1", "dev-chat", "tool_use")
    assert body["usage"] == {
        "input_tokens": 17,
        "output_tokens": 12,
        "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 8,
        "cache_creation": {"ephemeral_5m_input_tokens": 5, "ephemeral_1h_input_tokens": 0},
        "output_tokens_details": {"thinking_tokens": 3},
        "cost": {"total_cost": Decimal("0.25")},
    }


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
    ],
)
def test_finish_reasons_become_stop_reasons(finish_reason, stop_reason):
    completion = Completion(
        [{"index": 0, "message": {"content": "x"}, "finish_reason": finish_reason}], Usage()
    )
    body = message_of(generation(), Answer(completion, Decimal(0)), omitted=False)
    assert body["stop_reason"] == stop_reason


def test_an_upstreams_signature_and_redacted_thinking_are_kept_and_omitted_text_hidden():
    details = [
        {"type": "reasoning.text", "text": "Secret.", "signature": "EqQB", "index": 0},
        {"type": "reasoning.encrypted", "data": "opaque", "index": 1},
    ]
    completion = Completion(
        [
            {
                "index": 0,
                "message": {"content": "Hi", "reasoning_details": details},
                "finish_reason": "stop",
            }
        ],
        Usage(),
    )

    body = message_of(generation(), Answer(completion, Decimal(0)), omitted=True)

    assert body["content"][:2] == [
        {"type": "thinking", "thinking": "", "signature": "EqQB"},
        {"type": "redacted_thinking", "data": "opaque"},
    ]


def test_display_omitted_is_read_from_thinking():
    body = {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]}
    assert not thinking_omitted(parse_messages_request(body))
    body["thinking"] = {"type": "adaptive", "display": "omitted"}
    assert thinking_omitted(parse_messages_request(body))


def delta(finish_reason: str | None = None, **fields: Any) -> Chunk:
    return Chunk(choices=[{"index": 0, "delta": fields, "finish_reason": finish_reason}])


def items(*things):
    closed = []

    def generate():
        try:
            yield from things
        finally:
            closed.append(True)

    return generate(), closed


def test_a_stream_becomes_anthropics_events_in_order():
    stream, closed = items(
        None,
        delta(role="assistant", content=""),
        delta(reasoning="Let"),
        delta(reasoning=" me."),
        None,
        delta(content="Hello"),
        delta(
            tool_calls=[
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "f", "arguments": ""},
                }
            ]
        ),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"a":'}}]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": " 1}"}}]),
        delta("tool_calls"),
        StreamEnd(Usage(prompt_tokens=20, completion_tokens=7), Decimal("0.5"), "tool_calls"),
    )

    events = list(StreamTranslation(generation(exact=False), omitted=False).events(stream))

    kinds = [None if event is None else event["type"] for event in events]
    assert kinds == [
        None,
        "message_start",
        "content_block_start", "ping", "content_block_delta", "content_block_delta",
        None,
        "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = events[1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] == 0
    assert [e["index"] for e in events if e and e["type"] == "content_block_start"] == [0, 1, 2]
    assert events[7]["delta"] == {"type": "signature_delta", "signature": signature_of("Let me.")}
    assert events[12]["content_block"] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "f",
        "input": {},
    }
    arguments = "".join(e["delta"]["partial_json"] for e in events[13:15])
    assert json.loads(arguments) == {"a": 1}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 7
    assert events[-2]["usage"]["cost"] == {"total_cost": Decimal("0.5")}
    assert closed == [True]


def test_a_streamed_upstream_signature_and_omitted_thinking():
    stream, _ = items(
        delta(reasoning="Secret"),
        delta(reasoning_details=[{"type": "reasoning.text", "signature": "EqQB", "index": 0}]),
        delta(content="Hi"),
        StreamEnd(Usage(), Decimal(0), "stop"),
    )

    events = list(StreamTranslation(generation(), omitted=True).events(stream))

    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert deltas == [
        {"type": "signature_delta", "signature": "EqQB"},
        {"type": "text_delta", "text": "Hi"},
    ]
    assert events[0]["message"]["usage"]["input_tokens"] == 9


def test_a_failure_before_the_first_chunk_reaches_the_caller_before_any_event():
    def failing():
        yield None
        raise InvalidRequest("upstream refused")

    events = StreamTranslation(generation(), omitted=False).events(failing())

    assert next(events) is None
    with pytest.raises(InvalidRequest):
        next(events)


def test_an_answer_whose_content_comes_as_parts_is_one_text_block():
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    completion = Completion(
        [{"index": 0, "message": {"content": parts}, "finish_reason": "stop"}], Usage()
    )

    body = message_of(generation(), Answer(completion, Decimal(0)), omitted=False)

    assert body["content"] == [{"type": "text", "text": "Hello"}]
