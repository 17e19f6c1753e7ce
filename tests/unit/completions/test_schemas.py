"""parse_chat_request: the contract's request rules (sections 2.1-2.6 and 8)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.completions.schemas import parse_chat_request
from app.errors import InvalidRequest

USER = {"role": "user", "content": "Hello"}
WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


def make_body(**fields: Any) -> dict[str, Any]:
    """Build a valid minimal body, with ``fields`` added or replaced."""
    body: dict[str, Any] = {"model": "m-1", "messages": [dict(USER)]}
    body.update(fields)
    return body


def message(**fields: Any) -> dict[str, Any]:
    """Build a body whose only message is ``fields``."""
    return make_body(messages=[fields])


def parts(*content_parts: Any) -> dict[str, Any]:
    """Build a body whose only message is a user message made of ``content_parts``."""
    return message(role="user", content=list(content_parts))


def tool(name: str = "get_weather", **function: Any) -> dict[str, Any]:
    """Build a function tool called ``name``."""
    return {"type": "function", "function": {"name": name, **function}}


def tool_call(**fields: Any) -> dict[str, Any]:
    """Build an earlier tool call, with ``fields`` replaced."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    call.update(fields)
    return call


def reject(body: Any) -> InvalidRequest:
    """Parse ``body``, expecting InvalidRequest, and return it."""
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(body)
    return caught.value


REJECTED = [
    # model and messages
    ("model missing", {"messages": [USER]}, "model", "is required"),
    ("model null", make_body(model=None), "model", "is required"),
    ("model empty", make_body(model=""), "model", "must not be empty"),
    ("model not a string", make_body(model=7), "model", "must be a string"),
    ("messages missing", {"model": "m-1"}, "messages", "is required"),
    ("messages null", make_body(messages=None), "messages", "is required"),
    ("messages empty", make_body(messages=[]), "messages", "must not be empty"),
    ("messages not a list", make_body(messages="Hello"), "messages", "must be an array"),
    ("message not an object", make_body(messages=["Hello"]), "messages[0]", "must be an object"),
    ("message null", make_body(messages=[None]), "messages[0]", "must be an object"),
    # ChatMessage
    ("role missing", message(content="Hi"), "messages[0].role", "is required"),
    (
        "role unknown",
        message(role="robot", content="Hi"),
        "messages[0].role",
        "must be one of system, developer, user, assistant, tool",
    ),
    ("role not a string", message(role=1, content="Hi"), "messages[0].role", "must be a string"),
    ("user content missing", message(role="user"), "messages[0].content", "is required"),
    ("system content null", message(role="system", content=None), "messages[0].content", ""),
    ("developer content missing", message(role="developer"), "messages[0].content", ""),
    (
        "content not string or list",
        message(role="user", content=5),
        "messages[0].content",
        "must be a string or an array",
    ),
    (
        "content empty list",
        message(role="user", content=[]),
        "messages[0].content",
        "must not be empty",
    ),
    (
        "tool message without tool_call_id",
        message(role="tool", content="18C"),
        "messages[0].tool_call_id",
        "is required",
    ),
    (
        "tool_call_id not a string",
        message(role="tool", content="18C", tool_call_id=1),
        "messages[0].tool_call_id",
        "must be a string",
    ),
    (
        "tool message without content",
        message(role="tool", tool_call_id="call_1"),
        "messages[0].content",
        "is required",
    ),
    (
        "assistant without content or tool_calls",
        message(role="assistant"),
        "messages[0].content",
        "tool_calls",
    ),
    (
        "name not a string",
        message(role="user", content="Hi", name=["bob"]),
        "messages[0].name",
        "must be a string",
    ),
    (
        "tool_calls on a user message",
        message(role="user", content="Hi", tool_calls=[tool_call()]),
        "messages[0].tool_calls",
        "assistant",
    ),
    (
        "tool_calls not a list",
        message(role="assistant", tool_calls=tool_call()),
        "messages[0].tool_calls",
        "must be an array",
    ),
    (
        "tool call without id",
        message(role="assistant", tool_calls=[tool_call(id=None)]),
        "messages[0].tool_calls[0].id",
        "is required",
    ),
    (
        "tool call of another type",
        message(role="assistant", tool_calls=[tool_call(type="retrieval")]),
        "messages[0].tool_calls[0].type",
        "must be one of function",
    ),
    (
        "tool call without function",
        message(role="assistant", tool_calls=[tool_call(function=None)]),
        "messages[0].tool_calls[0].function",
        "is required",
    ),
    (
        "tool call arguments not a string",
        message(
            role="assistant",
            tool_calls=[tool_call(function={"name": "f", "arguments": {"city": "Paris"}})],
        ),
        "messages[0].tool_calls[0].function.arguments",
        "must be a string",
    ),
    # ContentPart
    (
        "part type unknown",
        parts({"type": "text", "text": "a"}, {"type": "input_audio", "input_audio": {}}),
        "messages[0].content[1].type",
        "must be one of text, image_url",
    ),
    ("part type missing", parts({"text": "a"}), "messages[0].content[0].type", "is required"),
    (
        "part type not a string",
        parts({"type": ["text"], "text": "a"}),
        "messages[0].content[0].type",
        "must be one of",
    ),
    ("part not an object", parts("a"), "messages[0].content[0]", "must be an object"),
    ("text part without text", parts({"type": "text"}), "messages[0].content[0].text", ""),
    (
        "text not a string",
        parts({"type": "text", "text": 3}),
        "messages[0].content[0].text",
        "must be a string",
    ),
    (
        "image part without image_url",
        parts({"type": "image_url"}),
        "messages[0].content[0].image_url",
        "is required",
    ),
    (
        "image_url not an object",
        parts({"type": "image_url", "image_url": "https://x/a.png"}),
        "messages[0].content[0].image_url",
        "must be an object",
    ),
    (
        "image url missing",
        parts({"type": "image_url", "image_url": {"detail": "low"}}),
        "messages[0].content[0].image_url.url",
        "is required",
    ),
    (
        "image url empty",
        parts({"type": "image_url", "image_url": {"url": ""}}),
        "messages[0].content[0].image_url.url",
        "must not be empty",
    ),
    (
        "image detail unknown",
        parts({"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "max"}}),
        "messages[0].content[0].image_url.detail",
        "must be one of low, high, auto",
    ),
    # sampling and limits
    ("temperature above 2", make_body(temperature=2.5), "temperature", "between 0 and 2"),
    ("temperature below 0", make_body(temperature=-0.1), "temperature", "between 0 and 2"),
    ("temperature as string", make_body(temperature="1"), "temperature", "must be a number"),
    ("temperature as boolean", make_body(temperature=True), "temperature", "must be a number"),
    ("temperature not finite", make_body(temperature=float("nan")), "temperature", "number"),
    ("top_p above 1", make_body(top_p=1.01), "top_p", "between 0 and 1"),
    ("top_p as string", make_body(top_p="0.5"), "top_p", "must be a number"),
    ("max_tokens zero", make_body(max_tokens=0), "max_tokens", "between 1 and"),
    ("max_tokens too large", make_body(max_tokens=1_000_001), "max_tokens", "between 1 and"),
    ("max_tokens a float", make_body(max_tokens=10.0), "max_tokens", "must be an integer"),
    ("max_tokens a string", make_body(max_tokens="10"), "max_tokens", "must be an integer"),
    ("max_tokens a boolean", make_body(max_tokens=True), "max_tokens", "must be an integer"),
    (
        "max_completion_tokens zero",
        make_body(max_completion_tokens=0),
        "max_completion_tokens",
        "between 1 and",
    ),
    (
        "reasoning_effort unknown",
        make_body(reasoning_effort="extreme"),
        "reasoning_effort",
        "must be one of none, minimal, low, medium, high",
    ),
    ("stop with 5 sequences", make_body(stop=["a", "b", "c", "d", "e"]), "stop", "1 and 4"),
    ("stop empty list", make_body(stop=[]), "stop", "1 and 4"),
    ("stop a number", make_body(stop=5), "stop", "must be a string or an array"),
    ("stop with an empty string", make_body(stop=["a", ""]), "stop[1]", "non-empty string"),
    ("stop with a number", make_body(stop=["a", 1]), "stop[1]", "non-empty string"),
    ("stream as string", make_body(stream="true"), "stream", "must be a boolean"),
    ("stream as integer", make_body(stream=1), "stream", "must be a boolean"),
    ("stream_options not an object", make_body(stream_options=True), "stream_options", ""),
    (
        "include_usage not a boolean",
        make_body(stream=True, stream_options={"include_usage": "yes"}),
        "stream_options.include_usage",
        "must be a boolean",
    ),
    ("seed above int64", make_body(seed=2**63), "seed", "64"),
    ("seed below int64", make_body(seed=-(2**63) - 1), "seed", "64"),
    ("seed a float", make_body(seed=1.5), "seed", "must be an integer"),
    ("n zero", make_body(n=0), "n", "between 1 and 16"),
    ("n above 16", make_body(n=17), "n", "between 1 and 16"),
    ("n a float", make_body(n=2.0), "n", "must be an integer"),
    (
        "frequency_penalty below -2",
        make_body(frequency_penalty=-2.5),
        "frequency_penalty",
        "between -2 and 2",
    ),
    (
        "presence_penalty above 2",
        make_body(presence_penalty=3),
        "presence_penalty",
        "between -2 and 2",
    ),
    ("logit_bias a list", make_body(logit_bias=[1, 2]), "logit_bias", "must be an object"),
    ("logit_bias value too big", make_body(logit_bias={"50256": 101}), "logit_bias", "-100"),
    ("logit_bias value a string", make_body(logit_bias={"50256": "5"}), "logit_bias", "numbers"),
    ("logit_bias value a boolean", make_body(logit_bias={"1": True}), "logit_bias", "numbers"),
    ("logprobs an integer", make_body(logprobs=1), "logprobs", "must be a boolean"),
    (
        "top_logprobs above 20",
        make_body(logprobs=True, top_logprobs=21),
        "top_logprobs",
        "between 0 and 20",
    ),
    (
        "top_logprobs below 0",
        make_body(logprobs=True, top_logprobs=-1),
        "top_logprobs",
        "between 0 and 20",
    ),
    ("top_logprobs without logprobs", make_body(top_logprobs=2), "top_logprobs", "logprobs"),
    (
        "top_logprobs with logprobs false",
        make_body(logprobs=False, top_logprobs=2),
        "top_logprobs",
        "logprobs is true",
    ),
    ("user not a string", make_body(user=42), "user", "must be a string"),
    # response_format
    (
        "response_format a string",
        make_body(response_format="json"),
        "response_format",
        "must be an object",
    ),
    (
        "response_format without type",
        make_body(response_format={}),
        "response_format.type",
        "is required",
    ),
    (
        "response_format type unknown",
        make_body(response_format={"type": "xml"}),
        "response_format.type",
        "must be one of text, json_object, json_schema",
    ),
    (
        "json_schema missing",
        make_body(response_format={"type": "json_schema"}),
        "response_format.json_schema",
        "is required",
    ),
    (
        "json_schema not an object",
        make_body(response_format={"type": "json_schema", "json_schema": "x"}),
        "response_format.json_schema",
        "must be an object",
    ),
    (
        "json_schema without name",
        make_body(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
        "response_format.json_schema.name",
        "is required",
    ),
    (
        "json_schema schema not an object",
        make_body(
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": []}}
        ),
        "response_format.json_schema.schema",
        "must be an object",
    ),
    (
        "json_schema strict not a boolean",
        make_body(
            response_format={"type": "json_schema", "json_schema": {"name": "a", "strict": 1}}
        ),
        "response_format.json_schema.strict",
        "must be a boolean",
    ),
    # tools
    ("tools not a list", make_body(tools=tool()), "tools", "must be an array"),
    (
        "more than 128 tools",
        make_body(tools=[tool(f"f{i}") for i in range(129)]),
        "tools",
        "at most 128",
    ),
    ("tool not an object", make_body(tools=["get_weather"]), "tools[0]", "must be an object"),
    (
        "tool type not function",
        make_body(tools=[{"type": "retrieval", "function": {"name": "f"}}]),
        "tools[0].type",
        "must be one of function",
    ),
    (
        "tool without function",
        make_body(tools=[tool(), {"type": "function"}]),
        "tools[1].function",
        "is required",
    ),
    (
        "tool name missing",
        make_body(tools=[{"type": "function", "function": {"description": "x"}}]),
        "tools[0].function.name",
        "is required",
    ),
    (
        "tool name with a space",
        make_body(tools=[tool("get weather")]),
        "tools[0].function.name",
        "letters, digits",
    ),
    ("tool name too long", make_body(tools=[tool("f" * 65)]), "tools[0].function.name", "64"),
    (
        "tool description not a string",
        make_body(tools=[tool(description=1)]),
        "tools[0].function.description",
        "must be a string",
    ),
    (
        "tool parameters not an object",
        make_body(tools=[tool(parameters="{}")]),
        "tools[0].function.parameters",
        "must be an object",
    ),
    (
        "tool strict not a boolean",
        make_body(tools=[tool(strict="true")]),
        "tools[0].function.strict",
        "must be a boolean",
    ),
    (
        "duplicate tool names",
        make_body(tools=[tool("a"), tool("b"), tool("a")]),
        "tools[2].function.name",
        "unique",
    ),
    # tool_choice and parallel_tool_calls
    (
        "tool_choice unknown string",
        make_body(tools=[tool()], tool_choice="sometimes"),
        "tool_choice",
        '"none", "auto", "required"',
    ),
    (
        "tool_choice object without function",
        make_body(tools=[tool()], tool_choice={"type": "function"}),
        "tool_choice",
        "naming a function",
    ),
    (
        "tool_choice object of another type",
        make_body(tools=[tool()], tool_choice={"type": "x", "function": {"name": "get_weather"}}),
        "tool_choice",
        "naming a function",
    ),
    (
        "tool_choice names an unknown tool",
        make_body(tools=[tool()], tool_choice={"type": "function", "function": {"name": "x"}}),
        "tool_choice",
        "'x'",
    ),
    ("tool_choice auto without tools", make_body(tool_choice="auto"), "tool_choice", "tools"),
    ("tool_choice required, no tools", make_body(tool_choice="required"), "tool_choice", ""),
    (
        "tool_choice auto with empty tools",
        make_body(tools=[], tool_choice="auto"),
        "tool_choice",
        "tools",
    ),
    (
        "tool_choice object without tools",
        make_body(tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        "tool_choice",
        "tools",
    ),
    (
        "parallel_tool_calls a string",
        make_body(parallel_tool_calls="true"),
        "parallel_tool_calls",
        "must be a boolean",
    ),
    # several faults: the first in the contract's field order is reported
    (
        "temperature before tools",
        make_body(tools="x", temperature=9, top_p=9),
        "temperature",
        "between 0 and 2",
    ),
    (
        "model before messages",
        {"model": "", "messages": [], "temperature": 9},
        "model",
        "must not be empty",
    ),
    (
        "first bad message first",
        make_body(messages=[USER, {"role": "x"}, {"role": 1}]),
        "messages[1].role",
        "must be one of",
    ),
]


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [pytest.param(body, param, fragment, id=name) for name, body, param, fragment in REJECTED],
)
def test_rejects_with_the_offending_param(body, param, fragment):
    error = reject(body)

    assert (error.status, error.type) == (400, "invalid_request_error")
    assert error.param == param
    assert error.message.startswith(f"{param} ")
    assert fragment in error.message
    assert error.message.endswith(".")


@pytest.mark.parametrize("body", [[], "model", 3, None, True], ids=repr)
def test_rejects_a_body_that_is_not_an_object(body):
    error = reject(body)

    assert (error.status, error.param) == (400, None)
    assert "JSON object" in error.message


def test_does_not_change_the_caller_body():
    body = make_body(
        messages=[{"role": "developer", "content": "Be brief.", "x": 1}, USER],
        temperature=None,
        extra=True,
    )
    before = copy.deepcopy(body)

    parse_chat_request(body)

    assert body == before


def full_body() -> dict[str, Any]:
    """Build a body that sets every field of the contract."""
    return {
        "model": "m-1",
        "messages": [
            {"role": "system", "content": "Be brief.", "name": "rules"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is here, and the weather?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"},
                    },
                ],
            },
            {"role": "assistant", "content": None, "tool_calls": [tool_call()]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 18}'},
        ],
        "temperature": 0.2,
        "top_p": 1,
        "max_tokens": 100,
        "max_completion_tokens": 200,
        "reasoning_effort": "low",
        "stop": ["\n\n", "END"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "seed": -(2**63),
        "n": 2,
        "frequency_penalty": -2,
        "presence_penalty": 1.5,
        "logit_bias": {"50256": -100, "11": 2.5},
        "logprobs": True,
        "top_logprobs": 20,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": True},
        },
        "tools": [tool(description="Weather by city.", parameters=WEATHER_PARAMETERS, strict=True)],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "user": "end-user-7",
    }


def test_accepts_a_body_with_every_field():
    body = full_body()

    request = parse_chat_request(body)

    assert (request.model, request.stream, request.include_usage) == ("m-1", True, True)
    assert request.messages == [
        {"role": "system", "content": "Be brief.", "name": "rules"},
        body["messages"][1],
        {"role": "assistant", "tool_calls": [tool_call()]},
        body["messages"][3],
    ]
    expected_params = {
        key: value
        for key, value in body.items()
        if key not in {"model", "messages", "stream", "stream_options"}
    }
    assert request.params == expected_params
    assert list(request.params) == list(expected_params)


def test_drops_unknown_fields_at_every_level():
    body = make_body(
        messages=[
            {"role": "user", "content": "Hi", "audio": {"id": "a1"}},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look", "cache_control": {"type": "ephemeral"}},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://x/a.png", "format": "png"},
                        "text": "not for images",
                    },
                ],
            },
            {
                "role": "assistant",
                "tool_calls": [
                    tool_call(index=0, function={"name": "f", "arguments": "{}", "x": 1})
                ],
                "refusal": None,
            },
        ],
        tools=[{"type": "function", "function": {"name": "f", "x": 1}, "cache_control": {}}],
        response_format={"type": "json_object", "json": True},
        stream_options={"include_usage": False, "continuous_usage_stats": True},
        web_search_options={},
        modalities=["text"],
        metadata={"a": "b"},
    )

    request = parse_chat_request(body)

    assert request.messages == [
        {"role": "user", "content": "Hi"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look"},
                {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "auto"}},
            ],
        },
        {"role": "assistant", "tool_calls": [tool_call(function={"name": "f", "arguments": "{}"})]},
    ]
    assert request.params == {
        "response_format": {"type": "json_object"},
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }


def test_keeps_unknown_top_level_fields_aside_for_the_catalog_to_allow():
    body = make_body(temperature=0.5, top_k=40, chat_template_kwargs={"thinking": True})

    request = parse_chat_request(body)

    assert request.extra == {"top_k": 40, "chat_template_kwargs": {"thinking": True}}
    assert request.params == {"temperature": 0.5}
    assert parse_chat_request(make_body(stream=True)).extra == {}


def test_keeps_free_form_objects_whole():
    json_schema = {"name": "a", "schema": {"type": "object", "x-order": 1}, "extra": [1]}
    parameters = {"type": "object", "properties": {}, "$defs": {"d": {}}, "x-anything": None}
    logit_bias = {"50256": -100, "token": 0}
    body = make_body(
        response_format={"type": "json_schema", "json_schema": json_schema},
        tools=[tool("f", parameters=parameters)],
        logit_bias=logit_bias,
    )

    params = parse_chat_request(body).params

    assert params["response_format"]["json_schema"] == json_schema
    assert params["tools"][0]["function"]["parameters"] == parameters
    assert params["logit_bias"] == logit_bias


OPTIONAL_FIELDS = [
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "reasoning_effort",
    "stop",
    "stream",
    "stream_options",
    "seed",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
]


def test_drops_null_optional_fields():
    body = make_body(
        messages=[
            {"role": "user", "content": "Hi", "name": None, "tool_call_id": None},
            {"role": "assistant", "content": None, "tool_calls": [tool_call()]},
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "u", "detail": None}}],
            },
        ],
        **dict.fromkeys(OPTIONAL_FIELDS),
    )

    request = parse_chat_request(body)

    assert request.params == {}
    assert (request.stream, request.include_usage) == (False, False)
    assert request.messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "tool_calls": [tool_call()]},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "u", "detail": "auto"}}],
        },
    ]


@pytest.mark.parametrize(
    ("fields", "stream", "include_usage"),
    [
        ({}, False, False),
        ({"stream": True}, True, False),
        ({"stream": True, "stream_options": {"include_usage": True}}, True, True),
        ({"stream": True, "stream_options": {"include_usage": False}}, True, False),
        ({"stream": True, "stream_options": {}}, True, False),
        ({"stream": False, "stream_options": {"include_usage": True}}, False, False),
        ({"stream_options": {"include_usage": True}}, False, False),
    ],
)
def test_include_usage_only_when_streaming(fields, stream, include_usage):
    request = parse_chat_request(make_body(**fields))

    assert (request.stream, request.include_usage) == (stream, include_usage)
    assert "stream" not in request.params
    assert "stream_options" not in request.params


def test_accepts_the_developer_role_as_system():
    body = make_body(messages=[{"role": "developer", "content": "Be brief."}, USER])

    request = parse_chat_request(body)

    assert request.messages == [{"role": "system", "content": "Be brief."}, USER]


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0},
        {"temperature": 2},
        {"temperature": 1},
        {"top_p": 0.0},
        {"frequency_penalty": -2.0, "presence_penalty": 2},
        {"max_tokens": 1_000_000},
        {"seed": 2**63 - 1},
        {"n": 16},
        {"stop": ""},
        {"stop": "END"},
        {"stop": ["a", "b", "c", "d"]},
        {"logprobs": True, "top_logprobs": 0},
        {"logprobs": False},
        {"logit_bias": {}},
        {"reasoning_effort": "none"},
        {"reasoning_effort": "minimal"},
        {"response_format": {"type": "text"}},
        {"tool_choice": "none"},
        {"tools": []},
        {"tools": [tool(f"f{i}") for i in range(128)], "tool_choice": "required"},
    ],
    ids=lambda fields: ",".join(fields),
)
def test_accepts_values_at_the_limits(fields):
    request = parse_chat_request(make_body(**fields))

    assert request.params == fields


@pytest.mark.parametrize(
    "content",
    ["", "Hi", [{"type": "text", "text": ""}]],
    ids=["empty string", "string", "one text part"],
)
def test_accepts_content_shapes(content):
    request = parse_chat_request(message(role="user", content=content))

    assert request.messages == [{"role": "user", "content": content}]


def test_keeps_only_the_known_fields_of_a_tool_choice():
    choice = {"type": "function", "function": {"name": "f", "arguments": "{}"}, "x": 1}

    request = parse_chat_request(make_body(tools=[tool("f")], tool_choice=choice))

    assert request.params["tool_choice"] == {"type": "function", "function": {"name": "f"}}


def test_returns_max_output_tokens_and_choice_count_from_params():
    request = parse_chat_request(make_body(max_completion_tokens=64, n=3))

    assert (request.max_output_tokens, request.choice_count) == (64, 3)
