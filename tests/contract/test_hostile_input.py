"""Hostile bodies are refused quickly with a 400 in the envelope, before any credit is held."""

from __future__ import annotations

import json

import pytest
import requests

from tests.contract.conftest import billing_records


def nested_arrays(levels: int, items: int = 64) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "minItems": items, "items": schema}
    return schema


def tool_body(parameters: dict) -> dict:
    return {
        "model": "dev-chat",
        "messages": [{"role": "user", "content": "Call fill please"}],
        "tools": [
            {"type": "function", "function": {"name": "noop"}},
            {"type": "function", "function": {"name": "fill", "parameters": parameters}},
        ],
        "tool_choice": "required",
    }


def schema_body(schema: dict) -> dict:
    return {
        "model": "dev-chat",
        "messages": [{"role": "user", "content": "hello"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }


def post(server, key: str, body) -> requests.Response:
    return requests.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=body,
        timeout=30,
    )


FAN_OUT = {
    "$defs": {
        "wide": {
            "type": "object",
            "properties": {f"p{i}": {"$ref": "#/$defs/leaf"} for i in range(64)},
        },
        "leaf": {"type": "array", "minItems": 64, "items": {"type": "string", "minLength": 64}},
    },
    "type": "array",
    "minItems": 64,
    "items": {"$ref": "#/$defs/wide"},
}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (tool_body(nested_arrays(3)), "tools[1].function.parameters"),
        (tool_body(nested_arrays(4)), "tools[1].function.parameters"),
        (tool_body(FAN_OUT), "tools[1].function.parameters"),
        (schema_body(nested_arrays(3)), "response_format.json_schema.schema"),
        (
            schema_body(
                {
                    "type": "object",
                    "properties": {
                        f"p{i}": {"type": "string", "minLength": 4096} for i in range(32)
                    },
                }
            ),
            "response_format.json_schema.schema",
        ),
        (
            tool_body(
                {
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 10**30}},
                    "required": ["n"],
                }
            ),
            "tools[1].function.parameters",
        ),  # fmt: skip
    ],
    ids=[
        "arrays-3-deep",
        "arrays-4-deep",
        "ref-fan-out",
        "response-schema",
        "long-strings",
        "integer-past-2**53",
    ],
)
def test_a_schema_too_large_to_instantiate_is_400_before_any_hold(
    app, live_server, funded_key, body, param
):
    response = post(live_server, funded_key.key, body)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "schema_too_large",
        param,
    )
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert (generations, charges, holds) == ([], [], [])
    # The worker still serves.
    assert post(live_server, funded_key.key, schema_body(nested_arrays(2, 8))).status_code == 200


def test_a_schema_within_the_budget_is_answered(live_server, funded_key):
    response = post(live_server, funded_key.key, schema_body(nested_arrays(2)))
    assert response.status_code == 200, response.text


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("levels", [65, 900, 5000])
@pytest.mark.parametrize("where", ["body", "tool-parameters", "logit_bias"])
def test_json_nested_deeper_than_64_levels_is_400(live_server, funded_key, where, levels):
    nested = deep(levels - 1)
    raw = {
        "body": deep(levels),
        "tool-parameters": '{"model": "dev-chat", "messages": [], "tools": '
        '[{"type": "function", "function": {"name": "f", "parameters": {"x": NESTED}}}]}',
        "logit_bias": '{"model": "dev-chat", "messages": [], "logit_bias": {"1": NESTED}}',
    }[where].replace("NESTED", nested)
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}", "Content-Type": "application/json"},
        data=raw,
        timeout=30,
    )

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_json"


def test_json_nested_64_levels_deep_is_not_refused_for_its_depth(live_server, funded_key):
    nested = deep(64 - 5)  # the body, tools, the tool, its function and parameters: 5 levels
    raw = (
        '{"model": "dev-chat", "messages": [{"role": "user", "content": "hi"}], "tools": '
        '[{"type": "function", "function": {"name": "f", "parameters": {"x": NESTED}}}]}'
    ).replace("NESTED", nested)
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded_key.key}", "Content-Type": "application/json"},
        data=raw,
        timeout=30,
    )
    assert response.status_code == 200, response.text


def test_a_bound_past_what_an_answer_holds_is_clamped_and_the_call_is_valid(
    live_server, funded_key
):
    parameters = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": -(10**30), "maximum": 10**30}},
        "required": ["n"],
    }

    response = post(live_server, funded_key.key, tool_body(parameters))

    assert response.status_code == 200, response.text
    (call,) = response.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "fill"
    arguments = json.loads(call["function"]["arguments"])
    assert type(arguments["n"]) is int and -(10**30) <= arguments["n"] <= 10**30
