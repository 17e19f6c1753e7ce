"""parse_messages_request and parse_count_tokens_request: Anthropic's request rules."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidRequest
from app.messages.schemas import parse_count_tokens_request, parse_messages_request

USER = {"role": "user", "content": "Hello"}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def make_body(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m-1", "max_tokens": 100, "messages": [dict(USER)]}
    body.update(fields)
    return body


def blocks(*content: Any, role: str = "user") -> dict[str, Any]:
    return make_body(messages=[{"role": role, "content": list(content)}])


def reject(body: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_messages_request(body)
    return caught.value


def test_a_minimal_body_parses():
    parsed = parse_messages_request(make_body())

    assert (parsed.model, parsed.max_tokens, parsed.stream) == ("m-1", 100, False)
    assert parsed.messages == [USER] and parsed.params == {} and parsed.extra == {}


def test_claude_codes_fields_are_accepted_and_unknown_ones_kept_aside():
    body = make_body(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[USER, {"role": "system", "content": "You can use Read."}],
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"effort": "high"},
        metadata={"user_id": '{"device_id":"d","session_id":"s"}'},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        tools=[{**WEATHER, "defer_loading": True}, {"type": "web_search_20250305", "name": "w"}],
        stream=True,
        top_k=5,
    )

    parsed = parse_messages_request(body)

    assert parsed.stream is True
    assert parsed.messages[1] == {"role": "system", "content": "You can use Read."}
    assert parsed.params["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert parsed.params["tools"][1] == {"type": "web_search_20250305", "name": "w"}
    assert parsed.params["system"] == [{"type": "text", "text": "Be brief."}]
    assert parsed.extra == {"context_management": body["context_management"]}


def test_every_known_block_parses_and_unknown_block_types_are_kept():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "18 C"}],
        "is_error": False,
    }
    server_result = {"type": "web_search_tool_result", "tool_use_id": "s", "content": []}

    parsed = parse_messages_request(
        blocks({"type": "text", "text": "hi"}, image, result, server_result)
    )

    assert parsed.messages[0]["content"] == [
        {"type": "text", "text": "hi"},
        image,
        result,
        server_result,
    ]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ([], "The request body must be a JSON object."),
        (make_body(max_tokens=None), "max_tokens is required."),
        (make_body(max_tokens=0), "max_tokens must be between 1 and 1000000."),
        (make_body(max_tokens="9"), "max_tokens must be an integer."),
        (make_body(messages=[]), "messages must not be empty."),
        (make_body(messages=[{"role": "tool", "content": "x"}]), "messages[0].role must be one of"),
        (make_body(messages=[{"role": "user"}]), "messages[0].content is required."),
        (blocks({"text": "no type"}), "messages[0].content[0].type is required."),
        (blocks({"type": "text"}), "messages[0].content[0].text is required."),
        (
            blocks({"type": "image", "source": {"type": "base64", "data": "AA"}}),
            "messages[0].content[0].source.media_type is required when type is base64.",
        ),
        (
            blocks({"type": "image", "source": {"type": "file", "file_id": "f"}}),
            "messages[0].content[0].source.type must be one of",
        ),
        (
            blocks({"type": "tool_use", "id": "t", "name": "n", "input": "{}"}, role="assistant"),
            "messages[0].content[0].input must be an object.",
        ),
        (
            blocks({"type": "tool_result", "tool_use_id": "t", "content": 5}),
            "messages[0].content[0].content must be a string or an array of content blocks.",
        ),
        (make_body(system=[{"type": "image"}]), "system[0].type must be text."),
        (make_body(temperature=1.5), "temperature must be between 0 and 1."),
        (make_body(stop_sequences="STOP"), "stop_sequences must be an array of strings."),
        (make_body(tools=[{"name": "a b", "input_schema": {}}]), "tools[0].name must be"),
        (make_body(tools=[{"name": "a"}]), "tools[0].input_schema is required."),
        (make_body(tools=[WEATHER, WEATHER]), "tools[1].name must be unique"),
        (make_body(tool_choice={"type": "tool"}), "tool_choice.name is required when type is"),
        (make_body(tool_choice={"type": "some"}), "tool_choice.type must be one of"),
        (make_body(thinking={"type": "enabled"}), "thinking.budget_tokens is required"),
        (
            make_body(thinking={"type": "enabled", "budget_tokens": 512}),
            "thinking.budget_tokens must be between 1024",
        ),
        (
            make_body(max_tokens=2000, thinking={"type": "enabled", "budget_tokens": 2000}),
            "thinking.budget_tokens must be less than max_tokens.",
        ),
        (make_body(output_config={"effort": "extreme"}), "output_config.effort must be one of"),
    ],
)
def test_bad_bodies_are_refused_naming_the_field(body, problem):
    error = reject(body)

    assert error.message.startswith(problem), error.message
    assert error.status == 400


def test_count_tokens_needs_no_max_tokens_and_drops_sampling_fields():
    parsed = parse_count_tokens_request(
        {"model": "m-1", "messages": [USER], "tools": [WEATHER], "temperature": 7}
    )

    assert parsed.max_tokens is None and parsed.params == {"tools": [WEATHER]}
