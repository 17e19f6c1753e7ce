"""What a Responses request asks for that is billed beyond its tokens."""

from __future__ import annotations

from app.catalog.pricing import DEFAULT_CALLS_HELD, NO_SURCHARGES, Surcharges
from app.responses.native import hosted_calls, surcharges_of


def test_hosted_tools_of_any_version_are_held_at_max_tool_calls_else_the_default():
    tools = [
        {"type": "web_search_preview_2025_03_11"},
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "image_generation"},
        {"type": "function", "name": "f", "parameters": {}},
        {"type": "mcp", "server_label": "docs"},
    ]
    asked = surcharges_of({"tools": tools, "service_tier": "flex"}, passed_through=True)
    assert asked.tier == "flex"
    assert asked.tool_calls == dict.fromkeys(
        ("web_search", "file_search", "image_generation", "mcp"), DEFAULT_CALLS_HELD
    )
    capped = surcharges_of({"tools": tools[:1], "max_tool_calls": 2}, passed_through=True)
    assert capped == Surcharges(tool_calls={"web_search": 2})


def test_a_translated_route_is_sent_neither_hosted_tools_nor_a_tier():
    body = {"tools": [{"type": "web_search"}], "service_tier": "priority"}
    assert surcharges_of(body, passed_through=False) is NO_SURCHARGES


def test_hosted_calls_are_the_output_items_of_their_types():
    output = [
        {"type": "web_search_call", "id": "ws_1"},
        {"type": "web_search_call", "id": "ws_2"},
        {"type": "code_interpreter_call", "id": "ci_1"},
        {"type": "image_generation_call", "id": "ig_1"},
        {"type": "mcp_call", "id": "mcp_1"},
        {"type": "mcp_list_tools", "id": "mcpl_1"},
        {"type": "function_call", "id": "fc_1"},
        {"type": "message", "id": "msg_1"},
        "not an item",
    ]
    assert hosted_calls(output) == {
        "web_search": 2,
        "code_interpreter": 1,
        "image_generation": 1,
        "mcp": 1,
    }
    assert hosted_calls([]) is None and hosted_calls(None) is None
