"""The body of POST /v1/responses: what is loaded, in one shape, and what is refused."""

from __future__ import annotations

import pytest

from app.errors import InvalidRequest
from app.responses.schemas import MAX_INPUT_ITEMS, parse_response_request


def parse(**body):
    return parse_response_request({"model": "m", **body})


def test_a_string_is_one_user_message_and_every_message_has_parts():
    request = parse(
        input=[
            {"role": "assistant", "content": "Before."},
            {"id": "msg_1"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
        ]
    )

    assert parse(input="Hi").input == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    ]
    assert request.input == [
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Before.", "annotations": []}]},
        {"type": "item_reference", "id": "msg_1"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed"},
    ]  # fmt: skip


def test_null_is_absent_unknown_fields_are_kept_aside_and_store_defaults_to_true():
    request = parse(input="Hi", temperature=None, client_metadata={"a": "b"}, top_k=3)

    assert "temperature" not in request.params
    assert request.extra == {"top_k": 3}
    assert request.store is True and request.stream is False


def test_files_recordings_and_images_by_file_id_are_kept_for_a_route_that_passes_them_on():
    parts = [
        {"type": "input_file", "file_id": "file-1"},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "input_image", "file_id": "file-2", "detail": "auto"},
    ]

    (message,) = parse(input=[{"role": "user", "content": parts}]).input

    assert message["content"] == parts


def test_codex_tools_are_loaded_as_sent():
    tools = [
        {"type": "function", "name": "exec_command", "strict": False, "parameters": {}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Agents.",
         "tools": [{"type": "function", "name": "spawn_agent", "parameters": {}}]},
        {"type": "web_search", "external_web_access": False},
    ]  # fmt: skip

    assert parse(input="Hi", tools=tools).params["tools"] == tools


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": 3}, "input"),
        ({"input": [{"content": "no role"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": 3}]}]},
         "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "detail": "low"}]}]},
         "input[0].content[0].image_url"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]},
         "input[0].arguments"),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ({"input": [{"role": "user", "content": "x"}] * (MAX_INPUT_ITEMS + 1)}, "input"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools[0].name"),
        ({"tools": [{"type": "namespace", "name": "n" * 40, "tools": [
            {"type": "function", "name": "f" * 30}]}]}, "tools[0].tools[0].name"),
        ({"tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"metadata": {"k": 1}}, "metadata"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"model": ""}, "model"),
    ],
)  # fmt: skip
def test_what_is_refused_names_its_field(body, param):
    with pytest.raises(InvalidRequest) as refused:
        parse(**{"input": "Hi", **body})

    assert refused.value.param == param
