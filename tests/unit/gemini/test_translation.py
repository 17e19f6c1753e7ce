"""Google's names and schemas read as the normalized request reads them."""

from __future__ import annotations

from app.gemini.schemas import camel_keys
from app.gemini.translation import CallIds, json_schema, reasoning_effort


def test_snake_case_keys_become_camel_case_but_callers_own_keys_do_not():
    body = {
        "generation_config": {
            "max_output_tokens": 5,
            "thinking_config": {"include_thoughts": True},
        },
        "contents": [{"parts": [{"function_call": {"name": "f", "args": {"file_path": "a"}}}]}],
        "tools": [{"function_declarations": [{"name": "f", "parameters": {"my_field": {}}}]}],
    }

    assert camel_keys(body) == {
        "generationConfig": {"maxOutputTokens": 5, "thinkingConfig": {"includeThoughts": True}},
        "contents": [{"parts": [{"functionCall": {"name": "f", "args": {"file_path": "a"}}}]}],
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"my_field": {}}}]}],
    }


def test_a_key_sent_under_both_names_keeps_the_camel_case_value():
    assert camel_keys({"maxOutputTokens": 1, "max_output_tokens": 2}) == {"maxOutputTokens": 1}
    assert camel_keys({"max_output_tokens": 2, "maxOutputTokens": 1}) == {"maxOutputTokens": 1}


def test_a_google_schema_becomes_json_schema():
    schema = {
        "type": "OBJECT",
        "properties": {
            "TYPE": {"type": "STRING", "nullable": True, "enum": ["a"]},
            "list": {"type": "ARRAY", "items": {"type": "INTEGER"}, "max_items": 3},
            "either": {"any_of": [{"type": "NUMBER"}, {"type": "BOOLEAN"}]},
        },
        "required": ["TYPE"],
        "property_ordering": ["TYPE", "list"],
    }

    assert json_schema(schema) == {
        "type": "object",
        "properties": {
            "TYPE": {"type": ["string", "null"], "enum": ["a"]},
            "list": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
            "either": {"anyOf": [{"type": "number"}, {"type": "boolean"}]},
        },
        "required": ["TYPE"],
    }


def test_results_without_ids_answer_the_earliest_call_of_their_name():
    calls = CallIds()
    first = calls.of_call({"name": "read"}, 1, 0)
    second = calls.of_call({"name": "read"}, 1, 1)
    named = calls.of_call({"name": "list", "id": "own-id"}, 1, 2)

    assert (first, second, named) == ("call_1_0", "call_1_1", "own-id")
    assert calls.of_result({"name": "read"}) == first
    assert calls.of_result({"name": "list", "id": "own-id"}) == named
    assert calls.of_result({"name": "read"}) == second


def test_thinking_settings_become_an_effort():
    assert reasoning_effort({}) is None
    assert reasoning_effort({"thinkingConfig": {"thinkingBudget": -1}}) is None
    assert reasoning_effort({"thinkingConfig": {"thinkingBudget": 0}}) == "none"
    assert reasoning_effort({"thinkingConfig": {"thinkingBudget": 1024}}) == "low"
    assert reasoning_effort({"thinkingConfig": {"thinkingBudget": 8192}}) == "medium"
    assert reasoning_effort({"thinkingConfig": {"thinkingBudget": 32768}}) == "high"
    assert reasoning_effort({"thinkingConfig": {"thinkingLevel": "HIGH", "thinkingBudget": 0}}) == (
        "high"
    )
