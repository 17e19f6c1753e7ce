"""The cheap prompt bound is never below the count, and long words are bounded tokens."""

from __future__ import annotations

import pytest

from app.providers.anthropic import AnthropicAdapter
from app.providers.base import ChatRequest, RouteTarget, UpstreamConfig
from app.providers.builtin import WORD_TOKEN_CHARACTERS, BuiltinAdapter, count_tokens
from app.providers.openai_compat import OpenAICompatAdapter

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo actuelle d'une ville — 天气",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
REQUESTS = [
    ChatRequest(model="m", messages=[{"role": "user", "content": "Hello"}]),
    ChatRequest(
        model="m",
        messages=[
            {"role": "system", "content": "Réponds en français, s'il te plaît. 🙂"},
            {"role": "user", "content": "日本語のテキストと emoji 🎉🎉🎉 and symbols ∑∫√"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
            {
                "role": "user",
                "name": "alice",
                "content": [
                    {"type": "text", "text": "And this?" * 300},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": "https://x/z.png"}},
                ],
            },
        ],
        params={
            "tools": [TOOL],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": {"type": "object"}},
            },
        },
    ),
    ChatRequest(model="m", messages=[{"role": "user", "content": "x" * 70_000 + " !?" * 5000}]),
    ChatRequest(model="m", messages=[{"role": "user", "content": " ".join(["ab"] * 20_000)}]),
]
TARGET = RouteTarget(upstream_model="m", capabilities=frozenset({"vision", "tools"}))


def adapters():
    yield BuiltinAdapter(UpstreamConfig(name="builtin", kind="builtin"))
    for tokenizer in ("cl100k_base", "o200k_base"):
        config = UpstreamConfig(
            name="o",
            kind="openai",
            base_url="http://127.0.0.1:9/v1",
            options={"tokenizer": tokenizer},
        )
        yield OpenAICompatAdapter(config)
    yield AnthropicAdapter(
        UpstreamConfig(name="a", kind="anthropic", base_url="http://127.0.0.1:9")
    )


@pytest.mark.parametrize("adapter", list(adapters()), ids=lambda a: a.upstream.name)
@pytest.mark.parametrize("request_", REQUESTS, ids=range(len(REQUESTS)))
def test_the_size_bound_is_never_below_the_count(adapter, request_):
    counted = adapter.count_prompt_tokens(request_, TARGET)
    assert adapter.prompt_token_bound(request_, TARGET) >= counted


@pytest.mark.parametrize("adapter", list(adapters()), ids=lambda a: a.upstream.name)
def test_counting_with_a_limit_stops_above_it_or_gives_the_count(adapter):
    huge = ChatRequest(model="m", messages=[{"role": "user", "content": "word " * 400_000}])
    assert adapter.count_prompt_tokens(huge, TARGET, limit=32_768) > 32_768
    small = REQUESTS[1]
    exact = adapter.count_prompt_tokens(small, TARGET)
    assert adapter.count_prompt_tokens(small, TARGET, limit=exact) == exact


def test_a_long_word_is_many_builtin_tokens():
    assert count_tokens("a" * WORD_TOKEN_CHARACTERS) == 1
    assert count_tokens("a" * (WORD_TOKEN_CHARACTERS + 1)) == 2
    assert count_tokens("x" * 5_000_000) == 5_000_000 // WORD_TOKEN_CHARACTERS
    assert count_tokens("Hello, world!") == 4
