"""Fuzz the chat completions body: whatever arrives, no 5xx, and every error in the envelope.

Bodies are drawn from the contract's request schema, then mutated: fields of the wrong
type, huge numbers, deep nesting, odd unicode, fields dropped. Most examples go through
the in-process test client (real WSGI, no sockets); a short run goes through gunicorn.

The default profile keeps the suite quick. Run it longer with
``HYPOTHESIS_PROFILE=long .venv/bin/pytest tests/contract/test_fuzz_request_body.py``
(or ``--hypothesis-profile=long``; ``HYPOTHESIS_EXAMPLES`` sets the number).
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from typing import Any

import hypothesis
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

settings.register_profile("default", max_examples=150, deadline=None, derandomize=False)
settings.register_profile(
    "long", max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "5000")), deadline=None
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

MODELS = ["dev-chat", "dev-chat-mini"]
ROLES = ["system", "developer", "user", "user", "assistant"]
HUGE = st.sampled_from([10**30, -(10**30), 2**63, -(2**63) - 1, 1e308, -1e308, 1e-308, 0])
ODD_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=()), max_size=40
) | st.sampled_from(["\u0000", "\u202e\u200b", "😀" * 20, "\ufeff", "a" * 5000])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | ODD_TEXT
    | HUGE
)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ODD_TEXT, inner, max_size=4),
    max_leaves=12,
)

text_part = st.fixed_dictionaries({"type": st.just("text"), "text": ODD_TEXT})
image_part = st.fixed_dictionaries(
    {
        "type": st.just("image_url"),
        "image_url": st.fixed_dictionaries(
            {"url": st.sampled_from(["https://example.com/a.png", "data:image/png;base64,AAAA"])},
            optional={"detail": st.sampled_from(["low", "high", "auto", "extreme"])},
        ),
    }
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(ROLES),
        "content": ODD_TEXT | st.lists(text_part | image_part, max_size=3) | st.none(),
    },
    optional={"name": ODD_TEXT, "tool_call_id": ODD_TEXT},
)
schema = st.recursive(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "number", "boolean", "null"])},
        optional={
            "minLength": HUGE | st.integers(0, 50),
            "minimum": HUGE,
            "enum": st.lists(SCALARS, max_size=3),
        },
    ),
    lambda inner: (
        st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(ODD_TEXT, inner, max_size=3)},
            optional={"required": st.lists(ODD_TEXT, max_size=3)},
        )
        | st.fixed_dictionaries(
            {"type": st.just("array"), "items": inner},
            optional={"minItems": st.integers(0, 64) | HUGE},
        )
    ),
    max_leaves=8,
)
tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["get_weather", "lookup"])},
            optional={"parameters": schema, "description": ODD_TEXT},
        ),
    }
)
OPTIONAL_FIELDS = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "max_tokens": st.integers(1, 2000),
    "n": st.integers(1, 4),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "stop": ODD_TEXT | st.lists(ODD_TEXT, max_size=5),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 20),
    "presence_penalty": st.floats(-2, 2),
    "logit_bias": st.dictionaries(
        st.sampled_from(["1", "50256"]), st.integers(-100, 100), max_size=2
    ),
    "user": ODD_TEXT,
    "reasoning_effort": st.sampled_from(["none", "low", "medium", "high"]),
    "tools": st.lists(tool, max_size=3),
    "tool_choice": st.sampled_from(["auto", "none", "required"])
    | st.fixed_dictionaries(
        {"type": st.just("function"), "function": st.fixed_dictionaries({"name": ODD_TEXT})}
    ),
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}])
    | st.fixed_dictionaries(
        {
            "type": st.just("json_schema"),
            "json_schema": st.fixed_dictionaries({"name": st.just("s"), "schema": schema}),
        }
    ),
}
contract_body = st.fixed_dictionaries(
    {"model": st.sampled_from(MODELS), "messages": st.lists(message, min_size=1, max_size=4)},
    optional=OPTIONAL_FIELDS,
)


def nest(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


@st.composite
def mutated_body(draw: st.DrawFn) -> Any:
    """A contract body, possibly with a field retyped, dropped, deepened, or not an object."""
    body = draw(contract_body)
    # Valid bodies as often as mutated ones, so the fuzz reaches the generation too.
    mutation = draw(st.sampled_from(["none"] * 5 + ["retype", "drop", "deepen", "huge", "replace"]))
    field = draw(st.sampled_from(["model", "messages", *OPTIONAL_FIELDS]))
    if mutation == "retype":
        body[field] = draw(ANY_JSON)
    elif mutation == "drop":
        body.pop(field, None)
    elif mutation == "deepen":
        body[field] = nest(body.get(field), draw(st.integers(1, 200)))
    elif mutation == "huge":
        body[field] = draw(HUGE)
    elif mutation == "replace":
        return draw(ANY_JSON)
    return body


def encode(body: Any) -> bytes:
    return json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")


def assert_answer_is_sound(status: int, content_type: str, payload: bytes) -> None:
    hypothesis.event(f"status {status}")  # --hypothesis-show-statistics shows the spread
    assert status < 500, payload[:500]
    if status >= 400:
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "code", "param"}
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)
    elif content_type.startswith("text/event-stream"):
        events = [line for line in payload.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]"
        for event in events[:-1]:
            assert "error" not in json.loads(event[6:]), event
    else:
        assert json.loads(payload)["object"] == "chat.completion"


@pytest.fixture
def fuzz_key(app, make_funded_key, monkeypatch) -> str:
    """A well-funded key shared by a test's examples, its per-key limit lifted in-process.

    Hypothesis runs every example inside one test call, so this is made once per test.
    """
    monkeypatch.setitem(app.config, "RATE_LIMIT", "1000000 per minute")
    return make_funded_key(Decimal("1000000")).key


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=mutated_body())
def test_any_body_gets_an_answer_or_an_error_in_the_envelope(client, fuzz_key, body):
    response = client.post(
        "/v1/chat/completions",
        data=encode(body),
        headers={"Authorization": f"Bearer {fuzz_key}", "Content-Type": "application/json"},
    )
    assert_answer_is_sound(response.status_code, response.content_type, response.get_data())


@settings(
    max_examples=25,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=mutated_body())
def test_any_body_over_gunicorn_gets_an_answer_or_an_error_in_the_envelope(
    live_server, fuzz_key, body
):
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        data=encode(body),
        headers={"Authorization": f"Bearer {fuzz_key}", "Content-Type": "application/json"},
        timeout=60,
    )
    assert_answer_is_sound(
        response.status_code, response.headers.get("Content-Type", ""), response.content
    )


# Every door's body, valid, then one value at any depth given another JSON type.

JSON_TYPES = (dict, list, str, bool, int, float, type(None))


def json_type(value: Any) -> type:
    return type(value) if type(value) in JSON_TYPES else object


def children(value: Any) -> list[tuple[Any, Any]]:
    """The keys and values of an object's members, or the indexes and values of an array's items."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, list):
        return list(enumerate(value))
    return []


def replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: replaced(value[head], rest, new)}
    return [
        replaced(item, rest, new) if index == head else item for index, item in enumerate(value)
    ]


def at(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


@st.composite
def retyped_somewhere(draw: st.DrawFn, bodies: st.SearchStrategy) -> Any:
    """A valid body, as often as not with one value at any depth of another JSON type."""
    body = draw(bodies)
    if draw(st.booleans()):
        return body
    # A walk down from the top, going deeper three times in four: deep values are as
    # likely to be picked as top-level ones, though far more numerous.
    path: tuple = ()
    node = body
    while children(node) and (not path or draw(st.integers(0, 3))):
        key, node = draw(st.sampled_from(children(node)))
        path = (*path, key)
    kind = json_type(at(body, path))
    new = draw(ANY_JSON.filter(lambda value: json_type(value) is not kind))
    hypothesis.note(f"{'.'.join(map(str, path))} = {new!r}")
    return replaced(body, path, new)


CACHE = st.fixed_dictionaries(
    {"type": st.just("ephemeral")}, optional={"ttl": st.sampled_from(["5m", "1h"])}
)
TEXT = st.text(max_size=20)
text_block = st.fixed_dictionaries(
    {"type": st.just("text"), "text": TEXT}, optional={"cache_control": CACHE}
)
image_block = st.fixed_dictionaries(
    {
        "type": st.just("image"),
        "source": st.sampled_from(
            [
                {"type": "url", "url": "https://example.com/a.png"},
                {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
            ]
        ),
    }
)
document_block = st.fixed_dictionaries(
    {
        "type": st.just("document"),
        "source": st.fixed_dictionaries(
            {"type": st.just("text"), "media_type": st.just("text/plain"), "data": TEXT}
        )
        | st.fixed_dictionaries(
            {
                "type": st.just("content"),
                "content": TEXT | st.lists(text_block | image_block, max_size=2),
            }
        ),
    },
    optional={"title": TEXT, "context": TEXT, "citations": st.just({"enabled": True})},
)
tool_use_block = st.fixed_dictionaries(
    {
        "type": st.just("tool_use"),
        "id": st.just("toolu_01"),
        "name": st.just("lookup"),
        "input": st.dictionaries(st.sampled_from(["q", "n"]), TEXT | st.integers(), max_size=2),
    }
)
tool_result_block = st.fixed_dictionaries(
    {"type": st.just("tool_result"), "tool_use_id": st.just("toolu_01")},
    optional={
        "content": TEXT | st.lists(text_block | image_block | document_block, max_size=2),
        "is_error": st.booleans(),
    },
)
thinking_block = st.fixed_dictionaries(
    {"type": st.just("thinking"), "thinking": TEXT, "signature": st.just("c2lnbmVk")}
)
search_result_block = st.fixed_dictionaries(
    {
        "type": st.just("search_result"),
        "source": st.just("https://example.com"),
        "title": TEXT,
        "content": st.lists(text_block, max_size=2),
    }
)
user_turn = st.fixed_dictionaries(
    {
        "role": st.just("user"),
        "content": TEXT
        | st.lists(
            text_block | image_block | document_block | tool_result_block | search_result_block,
            min_size=1,
            max_size=3,
        ),
    }
)
assistant_turn = st.fixed_dictionaries(
    {
        "role": st.just("assistant"),
        "content": TEXT
        | st.lists(text_block | thinking_block | tool_use_block, min_size=1, max_size=3),
    }
)
anthropic_tool = st.fixed_dictionaries(
    {
        "name": st.just("lookup"),
        "input_schema": st.just({"type": "object", "properties": {"q": {"type": "string"}}}),
    },
    optional={"description": TEXT, "cache_control": CACHE},
)
MESSAGES_FIELDS = {
    "system": TEXT | st.lists(text_block, max_size=2),
    "tools": st.lists(anthropic_tool, max_size=1),
    "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "none"}, {"type": "any"}]),
    "thinking": st.sampled_from([{"type": "adaptive"}, {"type": "disabled"}]),
    "output_config": st.fixed_dictionaries(
        {}, optional={"effort": st.sampled_from(["low", "high"])}
    ),
    "temperature": st.floats(0, 1),
    "top_p": st.floats(0, 1),
    "top_k": st.integers(0, 50),
    "stop_sequences": st.lists(st.text(min_size=1, max_size=5), max_size=2),
    "metadata": st.fixed_dictionaries({"user_id": TEXT}),
    "stream": st.booleans(),
}
messages_body = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "max_tokens": st.integers(1, 64),
        "messages": st.lists(user_turn | assistant_turn, min_size=1, max_size=3),
    },
    optional=MESSAGES_FIELDS,
)

input_text = st.fixed_dictionaries({"type": st.just("input_text"), "text": TEXT})
input_image = st.fixed_dictionaries(
    {"type": st.just("input_image"), "image_url": st.just("https://example.com/a.png")},
    optional={"detail": st.sampled_from(["low", "high", "auto"])},
)
response_items = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "developer"]),
            "content": TEXT | st.lists(input_text | input_image, min_size=1, max_size=2),
        },
        optional={"type": st.just("message")},
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("message"),
            "role": st.just("assistant"),
            "content": st.lists(
                st.fixed_dictionaries({"type": st.just("output_text"), "text": TEXT}),
                min_size=1,
                max_size=2,
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.just("call_1"),
            "name": st.just("lookup"),
            "arguments": st.just('{"q": "x"}'),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call_output"),
            "call_id": st.just("call_1"),
            "output": TEXT | st.lists(input_text | input_image, max_size=2),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("reasoning"),
            "summary": st.lists(
                st.fixed_dictionaries({"type": st.just("summary_text"), "text": TEXT}), max_size=2
            ),
        },
        optional={"encrypted_content": TEXT},
    ),
    st.fixed_dictionaries(
        {"type": st.just("web_search_call"), "id": st.just("ws_1"), "status": st.just("completed")}
    ),
)
function_tool = st.fixed_dictionaries(
    {"type": st.just("function"), "name": st.just("lookup")},
    optional={
        "parameters": st.just({"type": "object", "properties": {"q": {"type": "string"}}}),
        "strict": st.booleans(),
        "description": TEXT,
    },
)
RESPONSES_FIELDS = {
    "instructions": TEXT,
    "tools": st.lists(function_tool | st.just({"type": "web_search"}), max_size=2),
    "tool_choice": st.sampled_from(["auto", "none", "required"]),
    "parallel_tool_calls": st.booleans(),
    "max_output_tokens": st.integers(16, 64),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1),
    "reasoning": st.fixed_dictionaries(
        {}, optional={"effort": st.sampled_from(["low", "high"]), "summary": st.just("auto")}
    ),
    "text": st.fixed_dictionaries(
        {},
        optional={
            "format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]),
            "verbosity": st.just("low"),
        },
    ),
    "store": st.booleans(),
    "metadata": st.dictionaries(st.sampled_from(["a", "b"]), TEXT, max_size=2),
    "stream": st.booleans(),
}
responses_body = st.fixed_dictionaries(
    {
        "model": st.sampled_from(MODELS),
        "input": TEXT | st.lists(response_items, min_size=1, max_size=3),
    },
    optional=RESPONSES_FIELDS,
)


def assert_anthropic_answer_is_sound(status: int, content_type: str, payload: bytes) -> None:
    hypothesis.event(f"status {status}")
    assert status < 500, payload[:500]
    if status >= 400:
        body = json.loads(payload)
        assert set(body) == {"type", "error"} and body["type"] == "error"
        assert set(body["error"]) == {"type", "message"} and body["error"]["message"]
    elif content_type.startswith("text/event-stream"):
        text = payload.decode()
        assert "event: error" not in text and text.rstrip().endswith('{"type":"message_stop"}'), (
            text[-300:]
        )
    else:
        body = json.loads(payload)
        assert body.get("type") == "message" or set(body) == {"input_tokens"}, body


def assert_responses_answer_is_sound(status: int, content_type: str, payload: bytes) -> None:
    hypothesis.event(f"status {status}")
    assert status < 500, payload[:500]
    if status >= 400:
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "code", "param"} and error["message"]
    elif content_type.startswith("text/event-stream"):
        text = payload.decode()
        last = text.rstrip().rsplit("\n\n", 1)[-1]
        assert "event: error" not in text, text
        assert last.split("\n")[0] in ("event: response.completed", "event: response.incomplete")
    else:
        assert json.loads(payload)["object"] == "response"


# As many examples as the profile says (150 by default: a few seconds a door in-process).
FUZZ_SETTINGS = settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ_SETTINGS
@given(body=retyped_somewhere(contract_body))
def test_a_chat_body_with_a_value_of_another_type_at_any_depth_gets_the_envelope(
    client, fuzz_key, body
):
    response = client.post(
        "/v1/chat/completions",
        data=encode(body),
        headers={"Authorization": f"Bearer {fuzz_key}", "Content-Type": "application/json"},
    )
    assert_answer_is_sound(response.status_code, response.content_type, response.get_data())


@FUZZ_SETTINGS
@given(body=retyped_somewhere(messages_body), count=st.booleans())
def test_a_messages_body_with_a_value_of_another_type_at_any_depth_gets_anthropics_envelope(
    client, fuzz_key, body, count
):
    path = "/v1/messages/count_tokens" if count else "/v1/messages"
    response = client.post(
        path,
        data=encode(body),
        headers={
            "x-api-key": fuzz_key,
            "anthropic-version": "2023-06-01",
            "Content-Type": "application/json",
        },
    )
    assert_anthropic_answer_is_sound(
        response.status_code, response.content_type, response.get_data()
    )


@FUZZ_SETTINGS
@given(body=retyped_somewhere(responses_body))
def test_a_responses_body_with_a_value_of_another_type_at_any_depth_gets_the_envelope(
    client, fuzz_key, body
):
    response = client.post(
        "/v1/responses",
        data=encode(body),
        headers={"Authorization": f"Bearer {fuzz_key}", "Content-Type": "application/json"},
    )
    assert_responses_answer_is_sound(
        response.status_code, response.content_type, response.get_data()
    )


token_ids = st.lists(st.integers(0, 100_000) | HUGE, min_size=0, max_size=5)
embeddings_body = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["dev-embed", "dev-embed-latest", "dev-chat"]),
        "input": ODD_TEXT
        | st.lists(ODD_TEXT, max_size=4)
        | token_ids
        | st.lists(token_ids, max_size=3),
    },
    optional={
        "encoding_format": st.sampled_from(["float", "base64", "int8"]),
        "dimensions": st.integers(-2, 400) | HUGE,
        "user": ODD_TEXT,
    },
)


def assert_embeddings_answer_is_sound(status: int, payload: bytes) -> None:
    hypothesis.event(f"status {status}")
    assert status < 500, payload[:500]
    if status >= 400:
        error = json.loads(payload)["error"]
        assert set(error) == {"message", "type", "code", "param"}
    else:
        answer = json.loads(payload)
        assert answer["object"] == "list" and answer["data"]
        assert answer["usage"]["cost"]["total_cost"] >= 0


@FUZZ_SETTINGS
@given(body=retyped_somewhere(embeddings_body) | embeddings_body)
def test_an_embeddings_body_of_any_shape_gets_vectors_or_the_envelope(client, fuzz_key, body):
    response = client.post(
        "/v1/embeddings",
        data=encode(body),
        headers={"Authorization": f"Bearer {fuzz_key}", "Content-Type": "application/json"},
    )
    assert_embeddings_answer_is_sound(response.status_code, response.get_data())


gemini_part = st.fixed_dictionaries({}, optional={"text": ODD_TEXT, "inlineData": ANY_JSON})
embed_content_body = st.fixed_dictionaries(
    {"content": st.fixed_dictionaries({"parts": st.lists(gemini_part, max_size=3)})},
    optional={
        "model": st.sampled_from(["models/dev-embed", "dev-embed", "models/dev-chat"]),
        "taskType": st.sampled_from(["RETRIEVAL_QUERY", "CLUSTERING", "retrieval"]),
        "title": ODD_TEXT,
        "outputDimensionality": st.integers(-2, 400) | HUGE,
    },
)
batch_embed_body = st.fixed_dictionaries({"requests": st.lists(embed_content_body, max_size=4)})


def assert_gemini_embedding_answer_is_sound(status: int, payload: bytes, batch: bool) -> None:
    hypothesis.event(f"status {status}")
    assert status < 500, payload[:500]
    answer = json.loads(payload)
    if status >= 400:
        assert set(answer) == {"error"}
        assert set(answer["error"]) == {"code", "message", "status"}
        assert answer["error"]["code"] == status
    else:
        vectors = answer["embeddings"] if batch else [answer["embedding"]]
        assert vectors and all(vector["values"] for vector in vectors)
        assert answer["usageMetadata"]["cost"]["totalCost"] >= 0


@FUZZ_SETTINGS
@given(
    model=st.sampled_from(["dev-embed", "dev-embed-latest", "dev-chat"]),
    batch=st.booleans(),
    data=st.data(),
)
def test_a_gemini_embedding_body_of_any_shape_gets_vectors_or_googles_envelope(
    client, fuzz_key, model, batch, data
):
    shape = batch_embed_body if batch else embed_content_body
    body = data.draw(retyped_somewhere(shape) | shape)
    method = "batchEmbedContents" if batch else "embedContent"
    response = client.post(
        f"/v1beta/models/{model}:{method}",
        data=encode(body),
        headers={"x-goog-api-key": fuzz_key, "Content-Type": "application/json"},
    )
    assert_gemini_embedding_answer_is_sound(response.status_code, response.get_data(), batch)
