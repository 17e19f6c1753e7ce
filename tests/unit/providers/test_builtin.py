"""The builtin model follows the rules of docs/builtin-model.md, to the token."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import jsonschema
import pytest

from app.providers import builtin
from app.providers.base import ChatRequest, Chunk, RouteTarget, UpstreamConfig
from app.providers.builtin import BuiltinAdapter, count_tokens, tokenize
from app.providers.errors import UpstreamError

PLAIN = RouteTarget(upstream_model="builtin-dev", max_output_tokens=4096)
CAPABLE = RouteTarget(
    upstream_model="builtin-dev",
    capabilities=frozenset({"tools", "json_schema", "reasoning", "vision"}),
    max_output_tokens=4096,
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {
                "zone": {"type": "string", "maxLength": 3},
                "when": {"type": "string", "format": "date-time"},
            },
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "parameters": {
            "$defs": {
                "filter": {
                    "type": "object",
                    "properties": {
                        "field": {"type": "string"},
                        "value": {"type": ["string", "null"]},
                    },
                    "required": ["field", "value"],
                }
            },
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "array", "items": {"$ref": "#/$defs/filter"}, "minItems": 2},
                "limit": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
            },
            "required": ["query", "filters"],
        },
    },
}
TOOLS = [WEATHER, TIME, SEARCH]
TOOLING = RouteTarget(
    upstream_model="builtin-dev", capabilities=frozenset({"tools"}), max_output_tokens=4096
)
ORDER_SCHEMA = {
    "$defs": {"money": {"type": "number", "minimum": 0, "multipleOf": 0.25}},
    "type": "object",
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string", "format": "email"},
            },
            "required": ["name", "email"],
        },
        "lines": {
            "type": "array",
            "minItems": 2,
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "price": {"$ref": "#/$defs/money"}},
                "required": ["sku", "price"],
            },
        },
        "status": {"enum": ["open", "paid"]},
    },
    "required": ["id", "customer", "lines", "status"],
    "additionalProperties": False,
}
ORDER_FORMAT = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}


def make_adapter(**options: Any) -> BuiltinAdapter:
    return BuiltinAdapter(UpstreamConfig(name="builtin", kind="builtin", options=options))


def ask(text: str = "Hello there, model.", **params: Any) -> ChatRequest:
    return ChatRequest(model="dev", messages=[{"role": "user", "content": text}], params=params)


def converse(messages: list[dict[str, Any]], **params: Any) -> ChatRequest:
    return ChatRequest(model="dev", messages=messages, params=params)


def only_message(completion) -> dict[str, Any]:
    assert len(completion.choices) == 1
    return completion.choices[0]["message"]


def called_names(completion) -> list[str]:
    message = only_message(completion)
    return [call["function"]["name"] for call in message.get("tool_calls", [])]


def summarize(choice: dict[str, Any]) -> dict[str, Any]:
    """Reduce a complete() choice to what a client keeps, in the shape reassemble() builds."""
    message = choice["message"]
    calls = message.get("tool_calls", [])
    return {
        "content": message["content"] or "",
        "reasoning": message.get("reasoning") or "",
        "tool_calls": [
            {"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in calls
        ],
        "logprobs": (choice["logprobs"] or {}).get("content", []),
        "finish_reason": choice["finish_reason"],
    }


def apply_delta(state: dict[str, Any], choice: dict[str, Any]) -> None:
    delta = choice["delta"]
    state["content"] += delta.get("content", "")
    state["reasoning"] += delta.get("reasoning", "")
    for call in delta.get("tool_calls", []):
        if "id" in call:
            state["tool_calls"].append({"id": call["id"], "name": "", "arguments": ""})
        slot = state["tool_calls"][call["index"]]
        slot["name"] += call["function"].get("name", "")
        slot["arguments"] += call["function"]["arguments"]
    state["logprobs"] += (choice.get("logprobs") or {}).get("content", [])
    state["finish_reason"] = choice["finish_reason"]


def reassemble(chunks: list[Chunk]) -> list[dict[str, Any]]:
    """Rebuild the choices of a stream the way a client concatenates deltas."""
    states: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            empty = {"content": "", "reasoning": "", "tool_calls": [], "logprobs": []}
            apply_delta(states.setdefault(choice["index"], empty), choice)
    return [states[index] for index in sorted(states)]


def is_token_chunk(chunk: Chunk) -> bool:
    delta = chunk.choices[0]["delta"] if chunk.choices else {}
    calls = delta.get("tool_calls", [])
    return bool(delta.get("reasoning") or delta.get("content") or (calls and "id" not in calls[0]))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Hello, world!",
        "  leading and trailing  ",
        "tabs\tand\nnew lines\n\n",
        "émoji 🙂 and ünïcode — dashes",
        "snake_case, kebab-case and 3.14",
        "     ",
        '{"json": [1, 2, {"deep": null}]}',
    ],
)
def test_the_tokenizer_is_lossless(text):
    tokens = tokenize(text)
    assert "".join(tokens) == text
    assert count_tokens(text) == len(tokens)


def test_the_tokenizer_splits_words_and_punctuation_with_their_leading_space():
    assert tokenize("Hello, world!") == ["Hello", ",", " world", "!"]
    assert tokenize("a  ") == ["a", "  "]
    assert make_adapter().count_text_tokens("Hello, world!", PLAIN) == 4


ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"a": 1}'},
        }
    ],
}
PROMPT_CASES = [
    pytest.param([{"role": "user", "content": "Hello world"}], {}, PLAIN, 9, 0, id="one-message"),
    pytest.param([{"role": "user", "name": "alice", "content": "Hi"}], {}, PLAIN, 9, 0, id="name"),
    pytest.param(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Hi there"},
                    {"type": "text", "text": "again"},
                ],
            }
        ],
        {},
        PLAIN,
        10,
        0,
        id="text-parts",
    ),
    # 4 + 1 (name) + 7 ('{"a": 1}' is {, ", a, ", :, " 1, }) = 12 for the assistant turn.
    pytest.param(
        [{"role": "user", "content": "Weather?"}, ASSISTANT_CALL],
        {},
        PLAIN,
        6 + 12 + 3,
        0,
        id="tool-call",
    ),
    pytest.param(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}],
        {},
        PLAIN,
        7 + 6 + 3,
        0,
        id="system",
    ),
]


def image_message(detail: str | None) -> dict[str, Any]:
    image_url = {"url": "data:image/png;base64,iVBORw0KGgo="}
    if detail:
        image_url["detail"] = detail
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": image_url},
    ]
    return {"role": "user", "content": parts}


PROMPT_CASES += [
    pytest.param([image_message("low")], {}, CAPABLE, 11 + 85, 85, id="image-low"),
    pytest.param([image_message("high")], {}, CAPABLE, 11 + 765, 765, id="image-high"),
    pytest.param([image_message(None)], {}, CAPABLE, 11 + 765, 765, id="image-auto"),
    pytest.param([image_message("high")], {}, PLAIN, 11, 0, id="image-without-vision"),
]


@pytest.mark.parametrize("messages, params, target, prompt_tokens, image_tokens", PROMPT_CASES)
def test_prompt_tokens_follow_the_rules_and_match_the_count(
    messages, params, target, prompt_tokens, image_tokens
):
    request = converse(messages, seed=1, **params)
    adapter = make_adapter()
    usage = adapter.complete(request, target).usage
    assert adapter.count_prompt_tokens(request, target) == prompt_tokens
    assert usage.prompt_tokens == prompt_tokens
    assert usage.prompt_image_tokens == image_tokens


@pytest.mark.parametrize(
    "params",
    [
        {"tools": TOOLS},
        {"response_format": ORDER_FORMAT},
        {"tools": TOOLS, "tool_choice": "required", "n": 2},
    ],
)
def test_declarations_are_counted_in_the_prompt(params):
    request = ask("Hello world", seed=1, **params)
    schema = params.get("response_format", {}).get("json_schema", {}).get("schema")
    declared = count_tokens(json.dumps(params["tools"], sort_keys=True)) if "tools" in params else 0
    declared += count_tokens(json.dumps(schema)) if schema else 0
    adapter = make_adapter()
    assert adapter.count_prompt_tokens(request, CAPABLE) == 9 + declared
    assert adapter.complete(request, CAPABLE).usage.prompt_tokens == 9 + declared


def test_the_reply_echoes_the_user_and_adds_a_sentence():
    content = only_message(make_adapter().complete(ask("Hello there", seed=4), PLAIN))["content"]
    assert content.startswith("Hello there ")
    tail = content[len("Hello there ") :]
    assert re.fullmatch(r"[A-Z][a-z]+( [a-z]+){3,11}\.", tail)


def test_an_image_only_message_is_described():
    parts = [image_message("low")["content"][1]] * 2
    completion = make_adapter().complete(
        converse([{"role": "user", "content": parts}], seed=1), CAPABLE
    )
    assert only_message(completion)["content"].startswith("I see 2 image(s). ")


@pytest.mark.parametrize(
    "stop, content",
    [
        ("gamma", "alpha beta "),
        (["delta", "beta"], "alpha "),
        (["alpha"], ""),
    ],
)
def test_stop_sequences_cut_before_the_earliest_occurrence(stop, content):
    completion = make_adapter().complete(ask("alpha beta gamma delta", seed=1, stop=stop), PLAIN)
    assert only_message(completion)["content"] == content
    assert completion.choices[0]["finish_reason"] == "stop"
    assert completion.usage.completion_tokens == count_tokens(content)


@pytest.mark.parametrize(
    ("stop", "named"),
    [
        ("gamma", "gamma"),
        (["delta", "beta"], "beta"),
        # Both start at "beta": generated token by token, the shorter is completed first.
        (["beta gamma", "beta"], "beta"),
        (["omega"], None),
    ],
)
def test_the_stop_sequence_cut_at_is_named_whole_and_streamed(stop, named):
    request = ask("alpha beta gamma delta", seed=1, stop=stop)
    streamed = list(make_adapter().stream(replace(request, stream=True), PLAIN))

    assert make_adapter().complete(request, PLAIN).stop_sequence == named
    (finishing,) = [
        chunk for chunk in streamed if chunk.choices and chunk.choices[0]["finish_reason"]
    ]
    assert finishing.stop_sequence == named
    assert all(chunk.stop_sequence is None for chunk in streamed if chunk is not finishing)


def test_a_choice_cut_at_its_limit_before_its_stop_sequence_names_none():
    completion = make_adapter().complete(ask("alpha beta gamma", max_tokens=1, stop="beta"), PLAIN)

    assert completion.choices[0]["finish_reason"] == "length"
    assert completion.stop_sequence is None


@pytest.mark.parametrize(
    "params, target, content",
    [
        ({"max_tokens": 3}, PLAIN, "one two three"),
        ({"max_completion_tokens": 4, "max_tokens": 1}, PLAIN, "one two three four"),
        ({}, RouteTarget(upstream_model="tiny", max_output_tokens=2), "one two"),
    ],
)
def test_the_output_limit_truncates_at_a_token_with_finish_reason_length(params, target, content):
    completion = make_adapter().complete(ask("one two three four five", seed=1, **params), target)
    assert only_message(completion)["content"] == content
    assert completion.choices[0]["finish_reason"] == "length"
    assert completion.usage.completion_tokens == count_tokens(content)


def test_an_answer_within_the_limit_finishes_with_stop():
    completion = make_adapter().complete(ask("one two", seed=1, max_tokens=100), PLAIN)
    assert completion.choices[0]["finish_reason"] == "stop"
    assert completion.usage.completion_tokens == count_tokens(only_message(completion)["content"])


def test_n_choices_are_separate_and_their_usage_is_summed():
    completion = make_adapter().complete(ask("Hello world", seed=7, n=3), PLAIN)
    contents = [choice["message"]["content"] for choice in completion.choices]
    assert [choice["index"] for choice in completion.choices] == [0, 1, 2]
    assert all(content.startswith("Hello world ") for content in contents)
    assert len(set(contents)) == 3
    assert completion.usage.prompt_tokens == 9
    assert completion.usage.completion_tokens == sum(count_tokens(c) for c in contents)


def content_of(request: ChatRequest, target: RouteTarget = PLAIN) -> list[str]:
    return [
        choice["message"]["content"] for choice in make_adapter().complete(request, target).choices
    ]


def test_the_same_seed_gives_the_same_answer_and_different_seeds_differ():
    assert content_of(ask(seed=42, n=2)) == content_of(ask(seed=42, n=2))
    assert len({content_of(ask(seed=seed))[0] for seed in range(1, 6)}) == 5


def test_temperature_zero_is_deterministic():
    assert content_of(ask(temperature=0)) == content_of(ask(temperature=0))
    assert content_of(ask(temperature=0)) != content_of(ask(seed=0))


def test_without_seed_or_temperature_zero_answers_vary():
    assert content_of(ask(temperature=0.7)) != content_of(ask(temperature=0.7))


def test_the_seed_is_bound_to_the_prompt():
    assert content_of(ask("one", seed=3))[0][4:] != content_of(ask("two", seed=3))[0][4:]


NAMED_SEARCH = {"type": "function", "function": {"name": "search_docs"}}


@pytest.mark.parametrize(
    "tool_choice, text, parallel, names",
    [
        (None, "Please call get_weather for Paris", None, ["get_weather"]),
        ("auto", "Use get_time, then get_weather", None, ["get_weather", "get_time"]),
        ("auto", "Use get_time, then get_weather", False, ["get_weather"]),
        ("auto", "Just chat with me", None, []),
        ("none", "Please call get_weather", None, []),
        ("required", "Just chat with me", None, ["get_weather"]),
        ("required", "Look it up with search_docs", None, ["search_docs"]),
        ("required", "Use get_time and search_docs", True, ["get_time", "search_docs"]),
        ("required", "Use get_time and search_docs", False, ["get_time"]),
        (NAMED_SEARCH, "Hello", None, ["search_docs"]),
        (NAMED_SEARCH, "Use get_weather and get_time", None, ["search_docs"]),
    ],
)
def test_tool_choice_decides_which_tools_are_called(tool_choice, text, parallel, names):
    params = {"tools": TOOLS, "seed": 5}
    if tool_choice is not None:
        params["tool_choice"] = tool_choice
    if parallel is not None:
        params["parallel_tool_calls"] = parallel
    completion = make_adapter().complete(ask(text, **params), CAPABLE)
    message = only_message(completion)
    assert called_names(completion) == names
    if names:
        assert message["content"] is None
        assert completion.choices[0]["finish_reason"] == "tool_calls"
        assert all(re.fullmatch(r"call_[0-9a-f]{24}", call["id"]) for call in message["tool_calls"])
        assert all(call["type"] == "function" for call in message["tool_calls"])
    else:
        assert message["content"].startswith(text)
        assert "tool_calls" not in message
        assert completion.choices[0]["finish_reason"] == "stop"


@pytest.mark.parametrize("tool", TOOLS, ids=lambda tool: tool["function"]["name"])
def test_tool_arguments_validate_against_the_tool_schema(tool):
    name = tool["function"]["name"]
    request = ask(f"Use {name} for Paris", seed=2, tools=TOOLS, tool_choice="required")
    completion = make_adapter().complete(request, TOOLING)
    (call,) = only_message(completion)["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, tool["function"]["parameters"])
    expected = count_tokens(name) + count_tokens(call["function"]["arguments"])
    assert completion.usage.completion_tokens == expected


def test_string_arguments_are_taken_from_the_prompt():
    request = ask("Use get_weather for Paris", seed=2, tools=[WEATHER])
    (call,) = only_message(make_adapter().complete(request, CAPABLE))["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {
        "city": "Use",
        "unit": "celsius",
        "days": 1,
    }


def tool_turn(role_of_last: str) -> list[dict[str, Any]]:
    messages = [{"role": "user", "content": "Please call get_weather"}, ASSISTANT_CALL]
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"})
    if role_of_last == "user":
        messages.append({"role": "user", "content": "Thanks, and get_time?"})
    return messages


def test_after_a_tool_result_auto_answers_with_text():
    completion = make_adapter().complete(converse(tool_turn("tool"), tools=TOOLS, seed=1), CAPABLE)
    assert only_message(completion)["content"] == "Tool result received: Sunny, 21 C"
    assert completion.choices[0]["finish_reason"] == "stop"


def test_after_a_tool_result_required_calls_again_and_a_new_turn_can_call():
    adapter = make_adapter()
    required = converse(tool_turn("tool"), tools=TOOLS, tool_choice="required", seed=1)
    assert called_names(adapter.complete(required, CAPABLE)) == ["get_weather"]
    next_turn = converse(tool_turn("user"), tools=TOOLS, seed=1)
    assert called_names(adapter.complete(next_turn, CAPABLE)) == ["get_time"]


def test_tool_arguments_are_truncated_by_the_limit():
    request = ask("Use get_weather", seed=1, tools=[WEATHER], max_tokens=3)
    completion = make_adapter().complete(request, TOOLING)
    (call,) = only_message(completion)["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"'}
    assert completion.choices[0]["finish_reason"] == "length"
    assert completion.usage.completion_tokens == 3


def test_the_limit_keeps_whole_calls_first_and_counts_their_names():
    request = ask("Use get_time and search_docs", seed=1, tools=TOOLS)
    whole = only_message(make_adapter().complete(request, TOOLING))["tool_calls"]
    first = count_tokens("get_time") + count_tokens(whole[0]["function"]["arguments"])
    limited = ask("Use get_time and search_docs", seed=1, tools=TOOLS, max_tokens=first + 3)
    completion = make_adapter().complete(limited, TOOLING)
    calls = only_message(completion)["tool_calls"]
    assert calls[0] == whole[0]
    assert calls[1]["function"] == {"name": "search_docs", "arguments": '{"'}
    assert completion.choices[0]["finish_reason"] == "length"
    assert completion.usage.completion_tokens == first + 3


def test_json_object_wraps_the_reply():
    request = ask("Hello world", seed=1, response_format={"type": "json_object"})
    content = only_message(make_adapter().complete(request, PLAIN))["content"]
    assert json.loads(content)["reply"].startswith("Hello world ")


def test_json_schema_output_validates():
    request = ask("Make an order for Alice", seed=1, response_format=ORDER_FORMAT)
    content = only_message(make_adapter().complete(request, CAPABLE))["content"]
    validator = jsonschema.Draft202012Validator(
        ORDER_SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    validator.validate(json.loads(content))


@pytest.mark.parametrize(
    "effort, tokens",
    [(None, 48), ("none", 0), ("minimal", 16), ("low", 16), ("medium", 48), ("high", 128)],
)
def test_reasoning_follows_the_effort(effort, tokens):
    params = {"seed": 3} if effort is None else {"seed": 3, "reasoning_effort": effort}
    completion = make_adapter().complete(ask("Hi", **params), CAPABLE)
    message = only_message(completion)
    assert completion.usage.reasoning_tokens == tokens
    assert completion.usage.completion_tokens == tokens + count_tokens(message["content"])
    if tokens:
        assert message["reasoning"].startswith("Considering the request")
        assert count_tokens(message["reasoning"]) == tokens
        assert message["reasoning_details"] == [
            {
                "type": "reasoning.text",
                "text": message["reasoning"],
                "format": "builtin-v1",
                "index": 0,
            }
        ]
    else:
        assert message.get("reasoning") is None
        assert "reasoning_details" not in message


def test_models_without_reasoning_ignore_the_effort():
    completion = make_adapter().complete(ask("Hi", seed=3, reasoning_effort="high"), PLAIN)
    assert "reasoning" not in only_message(completion)
    assert completion.usage.reasoning_tokens == 0


def test_reasoning_consumes_the_budget_first():
    completion = make_adapter().complete(
        ask("Hi", seed=3, reasoning_effort="high", max_tokens=10), CAPABLE
    )
    message = only_message(completion)
    assert count_tokens(message["reasoning"]) == 10
    assert message["content"] == ""
    assert completion.choices[0]["finish_reason"] == "length"
    assert completion.usage.completion_tokens == completion.usage.reasoning_tokens == 10


@pytest.mark.parametrize("top", [0, 1, 5, 20])
def test_logprobs_cover_every_content_token(top):
    completion = make_adapter().complete(ask(seed=9, logprobs=True, top_logprobs=top), PLAIN)
    choice = completion.choices[0]
    entries = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert [entry["token"] for entry in entries] == tokenize(choice["message"]["content"])
    for entry in entries:
        assert entry["bytes"] == list(entry["token"].encode())
        assert -5 < entry["logprob"] <= 0
        alternatives = entry["top_logprobs"]
        assert len(alternatives) == top
        assert all(set(alt) == {"token", "logprob", "bytes"} for alt in alternatives)
        assert all(alt["bytes"] == list(alt["token"].encode()) for alt in alternatives)
        values = [alt["logprob"] for alt in alternatives]
        assert values == sorted(values, reverse=True)
        assert all(-5 < value <= 0 for value in values)
        if top:
            assert alternatives[0] == {k: entry[k] for k in ("token", "logprob", "bytes")}
            assert len({alt["token"] for alt in alternatives}) == top


def test_logprobs_are_absent_unless_asked_and_do_not_change_the_answer():
    plain = make_adapter().complete(ask(seed=9), PLAIN).choices[0]
    with_logprobs = make_adapter().complete(ask(seed=9, logprobs=True), PLAIN).choices[0]
    assert plain["logprobs"] is None
    assert plain["message"] == with_logprobs["message"]


POLICY = " ".join(["policy"] * 30)  # 30 tokens, 34 with the message overhead


def test_a_repeated_prefix_is_served_from_the_cache():
    adapter = make_adapter()
    system = {"role": "system", "content": POLICY}
    first = [system, {"role": "user", "content": "First question"}]
    assert adapter.complete(converse(first, seed=1), PLAIN).usage.cached_tokens == 0
    assert adapter.complete(converse(first, seed=1), PLAIN).usage.cached_tokens == 34
    answer = {"role": "assistant", "content": "An answer."}
    second = [*first, answer, {"role": "user", "content": "Second question"}]
    usage = adapter.complete(converse(second, seed=1), PLAIN).usage
    assert usage.cached_tokens == 34 + 6
    assert usage.prompt_tokens == 34 + 6 + 7 + 6 + 3


def test_short_prefixes_and_other_workers_are_not_cached():
    adapter = make_adapter()
    short = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    adapter.complete(converse(short, seed=1), PLAIN)
    assert adapter.complete(converse(short, seed=1), PLAIN).usage.cached_tokens == 0
    long = [{"role": "system", "content": POLICY}, {"role": "user", "content": "Hello"}]
    adapter.complete(converse(long, seed=1), PLAIN)
    assert make_adapter().complete(converse(long, seed=1), PLAIN).usage.cached_tokens == 0


def test_cached_and_image_tokens_never_exceed_the_prompt():
    adapter = make_adapter()
    messages = [{"role": "system", "content": POLICY}, image_message("high")]
    adapter.complete(converse(messages, seed=1), CAPABLE)
    usage = adapter.complete(converse(messages, seed=1), CAPABLE).usage
    assert (usage.cached_tokens, usage.prompt_image_tokens) == (34, 765)
    assert usage.cached_tokens + usage.prompt_image_tokens <= usage.prompt_tokens


def test_the_prompt_cache_is_bounded():
    cache = builtin.PromptCache(capacity=3)
    prompt = builtin.read_prompt(converse([{"role": "user", "content": POLICY}] * 5), PLAIN)
    cache.remember(prompt)
    assert len(cache._seen) == 3
    assert list(cache._seen) == list(prompt.prefix_digests[-3:])


STREAM_CASES = {
    "plain": {"seed": 1},
    "n": {"seed": 1, "n": 3},
    "temperature-zero": {"temperature": 0},
    "reasoning-logprobs": {
        "seed": 2,
        "reasoning_effort": "high",
        "logprobs": True,
        "top_logprobs": 3,
    },
    "parallel-tools": {"seed": 3, "tools": TOOLS, "tool_choice": "required", "n": 2},
    "json-schema": {
        "seed": 4,
        "response_format": ORDER_FORMAT,
    },
    "stop-and-length": {"seed": 5, "stop": ["zebra"], "max_tokens": 6, "reasoning_effort": "low"},
    "truncated-tools": {"seed": 6, "tools": TOOLS, "tool_choice": "required", "max_tokens": 9},
}


@pytest.mark.parametrize("params", STREAM_CASES.values(), ids=STREAM_CASES.keys())
def test_the_stream_reassembles_into_the_completion(params):
    request = ask("Use get_time and search_docs now", **params)
    completion = make_adapter().complete(request, CAPABLE)
    chunks = list(make_adapter().stream(request, CAPABLE))
    assert reassemble(chunks) == [summarize(choice) for choice in completion.choices]
    assert chunks[-1].usage == completion.usage


def test_stream_chunks_have_the_contract_shape():
    chunks = list(
        make_adapter().stream(ask(seed=1, n=2, tools=TOOLS, tool_choice="required"), CAPABLE)
    )
    *choice_chunks, last = chunks
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert all(len(chunk.choices) == 1 and chunk.usage is None for chunk in choice_chunks)
    choices = [chunk.choices[0] for chunk in choice_chunks]
    assert [choice["index"] for choice in choices] == sorted(choice["index"] for choice in choices)
    assert all({"index", "delta", "finish_reason"} <= set(choice) for choice in choices)
    for index in (0, 1):
        mine = [choice for choice in choices if choice["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert mine[-1] == {"index": index, "delta": {}, "finish_reason": "tool_calls"}
        assert all(choice["finish_reason"] is None for choice in mine[:-1])
    assert all(chunk.system_fingerprint == "fp_builtin_v1" for chunk in chunks)


@pytest.mark.parametrize("after", [0, 1, 7, 20])
def test_fail_after_tokens_kills_the_stream_after_exactly_that_many_tokens(after):
    stream = make_adapter(fail_after_tokens=after).stream(
        ask(seed=1, reasoning_effort="low"), CAPABLE
    )
    received = []
    with pytest.raises(UpstreamError, match=re.escape(builtin.FAILURE_MESSAGE)):
        for chunk in stream:
            received.append(chunk)
    assert sum(is_token_chunk(chunk) for chunk in received) == after
    assert all(chunk.usage is None for chunk in received)


def test_fail_after_tokens_counts_tool_arguments_and_fails_a_short_answer_at_the_end():
    request = ask("Use get_weather", seed=1, tools=[WEATHER])
    received = []
    with pytest.raises(UpstreamError):
        for chunk in make_adapter(fail_after_tokens=4).stream(request, CAPABLE):
            received.append(chunk)
    assert [is_token_chunk(chunk) for chunk in received].count(True) == 4
    with pytest.raises(UpstreamError):
        for _ in make_adapter(fail_after_tokens=10_000).stream(ask("Hi", seed=1), PLAIN):
            pass


def test_fail_after_tokens_fails_complete():
    with pytest.raises(UpstreamError, match="fail_after_tokens"):
        make_adapter(fail_after_tokens=3).complete(ask(seed=1), PLAIN)


def test_token_delay_sleeps_before_every_chunk(monkeypatch):
    sleeps = []
    monkeypatch.setattr(builtin.time, "sleep", sleeps.append)
    chunks = list(make_adapter(token_delay_seconds=0.25).stream(ask(seed=1), PLAIN))
    assert sleeps == [0.25] * len(chunks)


def test_no_delay_means_no_sleep(monkeypatch):
    sleeps = []
    monkeypatch.setattr(builtin.time, "sleep", sleeps.append)
    list(make_adapter().stream(ask(seed=1), PLAIN))
    assert sleeps == []
