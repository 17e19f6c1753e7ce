"""Token counts for holds and cut-off answers, with the offline bpe-openai encodings."""

from __future__ import annotations

from app.providers.base import ChatRequest
from app.providers.tokens import (
    DEFAULT_IMAGE_TOKENS,
    LOW_DETAIL_IMAGE_TOKENS,
    count_text,
    encoding_named,
    estimate_prompt_tokens,
)

CL100K = encoding_named("cl100k_base")
O200K = encoding_named("o200k_base")


def test_counts_match_the_published_encodings():
    assert count_text("hello world", CL100K) == 2
    assert count_text("", CL100K) == 0
    assert count_text("<|endoftext|>", CL100K) > 1  # special tokens are plain text here
    assert count_text("tiktoken is great!", CL100K) == 6  # the OpenAI cookbook's example
    assert count_text("hello world", O200K) == 2


def test_long_texts_are_counted_in_slices_without_hitting_the_encoder_limits():
    text = "lorem ipsum dolor sit amet " * 60_000  # 1.6 million characters

    tokens = count_text(text, CL100K)

    assert 300_000 <= tokens <= 330_000


def test_images_cost_a_flat_price_never_their_bytes():
    data_uri = "data:image/png;base64," + "A" * 2_000_000
    request = ChatRequest(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe both"},
                    {"type": "image_url", "image_url": {"url": data_uri, "detail": "auto"}},
                    {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
                ],
            }
        ],
    )
    text_only = ChatRequest(model="m", messages=[{"role": "user", "content": "Describe both"}])

    tokens = estimate_prompt_tokens(request, CL100K, image_tokens=DEFAULT_IMAGE_TOKENS)
    base = estimate_prompt_tokens(text_only, CL100K, image_tokens=DEFAULT_IMAGE_TOKENS)

    assert tokens - base == DEFAULT_IMAGE_TOKENS + LOW_DETAIL_IMAGE_TOKENS


def test_the_prompt_estimate_covers_tools_calls_and_schemas():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather of a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    bare = ChatRequest(model="m", messages=messages)
    with_tools = ChatRequest(model="m", messages=messages, params={"tools": tools})

    bare_tokens = estimate_prompt_tokens(bare, CL100K, image_tokens=DEFAULT_IMAGE_TOKENS)
    tool_tokens = estimate_prompt_tokens(with_tools, CL100K, image_tokens=DEFAULT_IMAGE_TOKENS)

    texts = ["Be brief.", "Weather in Paris?", "get_weather", '{"city": "Paris"}', "call_1"]
    assert bare_tokens > sum(count_text(text, CL100K) for text in texts) + 4 * len(messages)
    assert tool_tokens > bare_tokens + 20
