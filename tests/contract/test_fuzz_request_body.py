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
