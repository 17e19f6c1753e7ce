"""What a Messages request passed through asks for that is billed beyond its tokens."""

from __future__ import annotations

from app.catalog.pricing import DEFAULT_CALLS_HELD, Surcharges
from app.messages.native import surcharges_of


def test_server_tools_of_any_version_are_held_at_their_max_uses_else_the_default():
    body = {
        "tools": [
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 4},
            {"type": "web_fetch_20250910", "name": "web_fetch"},
            {"name": "get_weather", "input_schema": {"type": "object"}},
            {"type": "bash_20250124", "name": "bash"},
        ],
        "service_tier": "standard_only",
    }
    assert surcharges_of(body) == Surcharges(
        tier="standard_only", tool_calls={"web_search": 4, "web_fetch": DEFAULT_CALLS_HELD}
    )


def test_code_execution_and_a_named_container_hold_one_container():
    coded = {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]}
    assert surcharges_of(coded).tool_calls == {
        "code_execution": DEFAULT_CALLS_HELD,
        "container": 1,
    }
    assert surcharges_of({"container": "container_1"}).tool_calls == {"container": 1}


def test_mcp_servers_are_held_as_mcp_calls():
    body = {"mcp_servers": [{"type": "url", "url": "https://mcp.example", "name": "docs"}]}
    assert surcharges_of(body).tool_calls == {"mcp": DEFAULT_CALLS_HELD}
    assert surcharges_of({"mcp_servers": []}) == Surcharges()


def test_a_body_without_billed_extras_or_with_malformed_ones_asks_for_none():
    assert surcharges_of({}) == Surcharges()
    assert surcharges_of({"tools": "web_search", "service_tier": 2}) == Surcharges()
    assert surcharges_of({"tools": [3, {"type": 5}]}) == Surcharges()
