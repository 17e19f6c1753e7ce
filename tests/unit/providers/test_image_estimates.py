"""A ``detail: low`` image is held cheap only where the upstream honours ``detail``."""

from __future__ import annotations

import pytest

from app.providers.anthropic import AnthropicAdapter
from app.providers.base import ChatRequest, RouteTarget, UpstreamConfig
from app.providers.openai_compat import OpenAICompatAdapter
from app.providers.tokens import DEFAULT_IMAGE_TOKENS, LOW_DETAIL_IMAGE_TOKENS

TARGET = RouteTarget(upstream_model="m", capabilities=frozenset({"vision"}))
IMAGE = "data:image/png;base64,iVBORw0KGgo="


def with_image(detail: str | None) -> ChatRequest:
    image = {"url": IMAGE} | ({"detail": detail} if detail else {})
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": image}]
    return ChatRequest(model="m", messages=[{"role": "user", "content": content}])


def text_only() -> ChatRequest:
    content = [{"type": "text", "text": "What is this?"}]
    return ChatRequest(model="m", messages=[{"role": "user", "content": content}])


def adapter(kind: str):
    config = UpstreamConfig(name=kind, kind=kind, base_url="http://127.0.0.1:9/v1")
    return {"openai": OpenAICompatAdapter, "anthropic": AnthropicAdapter}[kind](config)


def test_an_openai_upstream_holds_a_low_detail_image_at_85_tokens():
    openai = adapter("openai")
    base = openai.count_prompt_tokens(text_only(), TARGET)
    assert openai.count_prompt_tokens(with_image("low"), TARGET) - base == LOW_DETAIL_IMAGE_TOKENS
    assert openai.count_prompt_tokens(with_image("high"), TARGET) - base == DEFAULT_IMAGE_TOKENS


@pytest.mark.parametrize("detail", ["low", "high", "auto", None])
def test_anthropic_ignores_detail_so_every_image_is_held_in_full(detail):
    claude = adapter("anthropic")
    base = claude.count_prompt_tokens(text_only(), TARGET)
    tokens = claude.count_prompt_tokens(with_image(detail), TARGET)
    assert tokens - base >= DEFAULT_IMAGE_TOKENS
