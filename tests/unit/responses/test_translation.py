"""Responses items to chat messages and back; a chat stream's deltas as Responses events."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from app.errors import APIError, InvalidRequest
from app.generations.lifecycle import StreamEnd
from app.providers.base import Chunk, Completion, Usage
from app.responses.bodies import EventWriter, ResponseDraft
from app.responses.ids import ItemIds
from app.responses.schemas import parse_response_request
from app.responses.translation import (
    StreamTranslation,
    ToolSet,
    chat_request,
    output_items,
    response_events,
)

FUNCTION = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
NAMESPACE = {"type": "namespace", "name": "crm", "description": "CRM", "tools": [FUNCTION]}


def translated(body: dict):
    request = parse_response_request({"model": "m", **body})
    return chat_request(request, request.input, ToolSet(request.params.get("tools", [])))


def delta(**fields) -> Chunk:
    return Chunk(choices=[{"index": 0, "delta": fields, "finish_reason": None}])


def call(index: int, arguments: str, call_id: str | None = None, name: str | None = None):
    piece = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        piece.update(id=call_id, type="function")
        piece["function"]["name"] = name
    return delta(tool_calls=[piece])


def run_stream(*chunks, tools=(), finish_reason="stop"):
    request = parse_response_request({"model": "m", "input": "hi", "tools": list(tools)})
    writer = EventWriter(ResponseDraft("resp_" + "0" * 40, 1, request))
    translation = StreamTranslation(writer, ToolSet(request.params.get("tools", [])))
    end = StreamEnd(Usage(prompt_tokens=3, completion_tokens=4), Decimal("0.01"), finish_reason)
    stored = []
    items = (item for item in [*chunks, None, end])
    sent = list(response_events(writer, translation, items, stored.append))
    return [event for chunk in sent if chunk is not None for event in chunk], stored


def test_a_conversation_becomes_chat_messages_in_order():
    sent = translated(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Plain words."},
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"},
                 {"type": "input_image", "image_url": "https://x/a.png", "detail": "original"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "assistant", "content": "Let me look."},
                {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}",
                 "namespace": "crm"},
                {"type": "function_call", "call_id": "c2", "name": "other", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "found"},
                {"type": "web_search_call", "id": "ws_1"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "none"}, {"type": "encrypted_content"}]},
            ],
        }
    )  # fmt: skip

    assert sent.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Plain words."},
        {"role": "user", "content": [
            {"type": "text", "text": "Hi"},
            {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}}]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "crm__lookup", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "other", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "tool", "tool_call_id": "c2", "content": "none"},
    ]  # fmt: skip


def test_settings_become_chat_parameters():
    sent = translated(
        {
            "input": "hi",
            "max_output_tokens": 50,
            "temperature": 0.5,
            "reasoning": {"effort": "xhigh", "summary": "auto"},
            "text": {"format": {"type": "json_schema", "name": "n", "schema": {}, "strict": True}},
            "safety_identifier": "u-1",
            "tools": [FUNCTION, NAMESPACE, {"type": "web_search"}, {"type": "custom", "name": "x"}],
            "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [FUNCTION]},
            "parallel_tool_calls": False,
            "top_k": 5,
        }
    )

    assert sent.params == {
        "temperature": 0.5,
        "max_tokens": 50,
        "reasoning_effort": "high",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "n", "schema": {}, "strict": True},
        },
        "user": "u-1",
        "tools": [
            {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
        ],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    assert sent.extra == {"top_k": 5}


def test_a_namespaced_function_is_offered_and_chosen_by_its_qualified_name():
    sent = translated(
        {"input": "hi", "tools": [NAMESPACE], "tool_choice": {"type": "function", "name": "lookup"}}
    )

    assert [tool["function"]["name"] for tool in sent.params["tools"]] == ["crm__lookup"]
    assert sent.params["tool_choice"] == {"type": "function", "function": {"name": "crm__lookup"}}


def test_only_hosted_tools_offer_the_model_nothing():
    sent = translated({"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": "required"})

    assert "tools" not in sent.params and "tool_choice" not in sent.params


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": []}, "input"),
        ({"input": "hi", "tools": [FUNCTION, FUNCTION]}, "tools"),
        ({"input": "hi", "tools": [FUNCTION], "tool_choice": {"type": "function", "name": "x"}},
         "tool_choice"),
    ],
)  # fmt: skip
def test_what_cannot_be_translated_is_refused(body, param):
    with pytest.raises(InvalidRequest) as refused:
        translated(body)

    assert refused.value.param == param


def test_a_whole_answer_becomes_reasoning_message_and_calls():
    tools = ToolSet([NAMESPACE])
    message = {
        "role": "assistant",
        "content": "Looking.",
        "reasoning": "Think.",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "crm__lookup", "arguments": "{}"}}],
    }  # fmt: skip
    completion = Completion(
        [{"index": 0, "message": message, "finish_reason": "tool_calls"}], Usage()
    )

    items, reason = output_items(completion, tools, ItemIds("resp_" + "a" * 40))

    assert reason is None
    assert [item["type"] for item in items] == ["reasoning", "message", "function_call"]
    assert items[0]["summary"] == [{"type": "summary_text", "text": "Think."}]
    assert items[2] | {"id": None} == {
        "id": None, "type": "function_call", "status": "completed", "call_id": "c1",
        "name": "lookup", "arguments": "{}", "namespace": "crm",
    }  # fmt: skip
    assert [item["id"][:5] for item in items] == ["rs_aa", "msg_a", "fc_aa"]


def test_a_cut_answer_is_incomplete():
    message = {"role": "assistant", "content": "Hel"}
    completion = Completion([{"index": 0, "message": message, "finish_reason": "length"}], Usage())

    items, reason = output_items(completion, ToolSet([]), ItemIds("resp_" + "b" * 40))

    assert reason == "max_output_tokens" and items[0]["status"] == "incomplete"


def test_a_stream_sends_reasoning_then_text_one_item_at_a_time():
    events, stored = run_stream(
        delta(role="assistant", content=""),
        delta(reasoning="Hm"),
        delta(reasoning="m."),
        delta(content="Hi"),
        delta(content="!"),
    )

    assert [event["type"] for event in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    (response,) = stored
    assert response == events[-1]["response"]
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    assert response["output"][1]["content"][0]["text"] == "Hi!"
    assert response["usage"]["cost"] == {"total_cost": Decimal("0.01")}
    added = events[9]
    assert added["item"]["content"] == [] and added["output_index"] == 1


def test_interleaved_parallel_calls_go_out_whole_one_after_the_other():
    events, stored = run_stream(
        call(0, '{"a"', "c0", "crm__lookup"),
        call(1, '{"b"', "c1", "other"),
        call(0, ": 1}"),
        call(1, ": 2}"),
        tools=[NAMESPACE, {"type": "function", "name": "other"}],
    )

    calls = stored[0]["output"]
    assert [(c["call_id"], c["name"], c.get("namespace")) for c in calls] == [
        ("c0", "lookup", "crm"),
        ("c1", "other", None),
    ]
    assert [json.loads(c["arguments"]) for c in calls] == [{"a": 1}, {"b": 2}]
    kinds = [event["type"] for event in events]
    assert kinds.count("response.output_item.added") == 2
    opened = [i for i, kind in enumerate(kinds) if kind == "response.output_item.added"]
    closed = [i for i, kind in enumerate(kinds) if kind == "response.output_item.done"]
    assert opened[0] < closed[0] < opened[1] < closed[1]
    done = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done == ['{"a": 1}', '{"b": 2}']


def test_a_stream_cut_short_ends_incomplete():
    events, stored = run_stream(delta(content="Hel"), finish_reason="length")

    assert events[-1]["type"] == "response.incomplete"
    assert stored[0]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert stored[0]["output"][0]["status"] == "incomplete"


def test_a_broken_stream_ends_with_error_then_failed_numbered_on():
    request = parse_response_request({"model": "m", "input": "hi"})
    writer = EventWriter(ResponseDraft("resp_" + "0" * 40, 1, request))
    writer.start()
    writer.text("Hel")
    writer.events.clear()

    framed = writer.failure(APIError("It broke.", code="upstream_error")).decode()

    blocks = [block.split("\n") for block in framed.strip().split("\n\n")]
    assert [names[0] for names in blocks] == ["event: error", "event: response.failed"]
    error, failed = (json.loads(lines[1][6:]) for lines in blocks)
    assert (error["sequence_number"], failed["sequence_number"]) == (5, 6)
    assert error["error"]["code"] == error["code"] == "upstream_error"
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["output"][0]["content"][0]["text"] == "Hel"


def test_nothing_is_sent_before_the_core_answers_and_closing_closes_it():
    request = parse_response_request({"model": "m", "input": "hi"})
    writer = EventWriter(ResponseDraft("resp_" + "0" * 40, 1, request))
    closed = []

    def failing():
        try:
            yield None
            raise APIError("down", code="upstream_unavailable")
        finally:
            closed.append(True)

    events = response_events(writer, StreamTranslation(writer, ToolSet([])), failing(), print)
    with pytest.raises(APIError):
        next(events)
    assert writer.sequence == 0 and closed == [True]
