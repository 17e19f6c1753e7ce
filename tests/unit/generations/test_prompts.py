"""A passed-through body read for its prompt: every string, numbers, images and opaque parts."""

from __future__ import annotations

import json

import pytest

from app.catalog.pricing import Pricing
from app.catalog.registry import Model
from app.gemini.native import SENT_BODY as GEMINI_BODY
from app.generations.errors import UncountableContent, UnsupportedContent
from app.generations.prompts import (
    BodyShape,
    SentPrompt,
    TranslatedPrompt,
    image,
    opaque,
    read_content,
    sent_prompt,
)
from app.messages.native import SENT_BODY as MESSAGES_BODY
from app.providers.anthropic import AnthropicAdapter
from app.providers.base import ChatRequest, PromptContent, Route, RouteTarget, UpstreamConfig
from app.providers.openai_compat import OpenAICompatAdapter
from app.responses.native import SENT_BODY as RESPONSES_BODY

SHAPE = BodyShape(
    settings=frozenset({"model", "max_tokens"}), media={"image": image, "file": opaque}
)
TARGET = RouteTarget(upstream_model="m")


def route(adapter_class=AnthropicAdapter, **options) -> Route:
    upstream = UpstreamConfig(name="u", kind="test", base_url="http://127.0.0.1:9", options=options)
    return Route(adapter=adapter_class(upstream), target=TARGET)


def model(capabilities=("vision",), context_length=1_000) -> Model:
    return Model(
        id="m",
        owned_by="test",
        context_length=context_length,
        max_output_tokens=100,
        capabilities=frozenset(capabilities),
        pricing=Pricing(*[1] * 5),
        routes=(route(),),
    )


def test_every_string_key_and_number_is_read_but_the_settings():
    body = {
        "model": "secret-model-name",
        "max_tokens": 7,
        "messages": [{"role": "user", "content": [{"type": "tool_use", "input": {"id": 12}}]}],
    }

    content = read_content(body, SHAPE)

    assert sorted(content.texts) == sorted(
        ["role", "user", "content", "type", "tool_use", "input", "id", "12"]
    )


def test_images_and_opaque_parts_are_counted_by_their_rules_not_their_bytes():
    body = {
        "input": [
            {"type": "image", "data": "A" * 10_000},
            {"type": "image", "detail": "low", "url": "https://example.com/a.png"},
            {"nested": [{"type": "file", "file_id": "f-1"}]},
        ]
    }

    content = read_content(body, SHAPE)

    assert (content.images, content.low_detail_images, content.opaque) == (1, 1, 1)
    assert "A" * 10_000 not in content.texts
    assert sorted(content.texts) == ["nested"]


def test_a_type_that_is_not_a_string_is_read_as_content():
    content = read_content({"input": [{"type": ["image"], "text": "x"}]}, SHAPE)

    assert sorted(content.texts) == ["image", "text", "type", "x"]


def test_a_body_nested_deeper_than_the_interpreter_recurses_is_read():
    nested: object = "deep"
    for _ in range(5_000):
        nested = {"a": [nested]}

    assert read_content({"input": nested}, SHAPE).texts.count("a") == 5_000


def test_binary_no_rule_covers_is_refused_naming_its_field():
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "clip",
                        "source": {"type": "base64", "media_type": "audio/wav", "data": "UklG"},
                    }
                ],
            }
        ]
    }

    with pytest.raises(UncountableContent) as refused:
        read_content(body, MESSAGES_BODY)

    assert refused.value.param == "messages" and "audio/wav" in refused.value.message


@pytest.mark.parametrize(
    "block, counted",
    [
        ({"type": "image", "source": {"type": "url", "url": "https://e.com/a.png"}}, "images"),
        (
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}},
            "opaque",
        ),
        ({"type": "document", "source": {"type": "file", "file_id": "file_1"}}, "opaque"),
        ({"type": "x", "source": {"type": "base64", "media_type": "image/png"}}, "images"),
    ],
)
def test_a_messages_bodys_binary_is_counted_wherever_it_is(block, counted):
    body = {
        "messages": [{"role": "user", "content": [{"type": "tool_result", "content": [block]}]}]
    }

    content = read_content(body, MESSAGES_BODY)

    assert getattr(content, counted) == 1


TEXT = "a long text the model reads"
# An image as each door writes one, in a field whose value the model reads as JSON.
AN_IMAGE_IN_MESSAGES = {"type": "image", "source": {"type": "base64", "data": TEXT}}
AN_IMAGE_IN_RESPONSES = {"type": "input_image", "image_url": TEXT}
AN_IMAGE_IN_GEMINI = {"inlineData": {"mimeType": "image/png", "data": TEXT}}


@pytest.mark.parametrize(
    "body, shape",
    [
        ({"tools": [{"name": "t", "input_schema": AN_IMAGE_IN_MESSAGES}]}, MESSAGES_BODY),
        (
            {"messages": [{"content": [{"type": "tool_use", "input": AN_IMAGE_IN_MESSAGES}]}]},
            MESSAGES_BODY,
        ),
        ({"tools": [{"type": "function", "parameters": AN_IMAGE_IN_RESPONSES}]}, RESPONSES_BODY),
        ({"text": {"format": {"schema": AN_IMAGE_IN_RESPONSES}}}, RESPONSES_BODY),
        (
            {"contents": [{"parts": [{"functionCall": {"args": AN_IMAGE_IN_GEMINI}}]}]},
            GEMINI_BODY,
        ),
        (
            {"tools": [{"functionDeclarations": [{"parameters": AN_IMAGE_IN_GEMINI}]}]},
            GEMINI_BODY,
        ),
    ],
)
def test_what_looks_like_an_image_in_a_free_form_field_is_read_as_text(body, shape):
    content = read_content(body, shape)

    assert (content.images, content.opaque) == (0, 0)
    assert TEXT in content.texts


def test_a_text_documents_text_is_read():
    block = {"type": "document", "source": {"type": "text", "data": "the text"}}

    content = read_content({"messages": [{"role": "user", "content": [block]}]}, MESSAGES_BODY)

    assert "the text" in content.texts and content.opaque == 0


def test_a_responses_bodys_files_recordings_and_screenshots():
    body = {
        "store": False,
        "input": [
            {"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]},
            {"type": "computer_call_output", "output": {"type": "computer_screenshot"}},
            {"role": "user", "content": [{"type": "input_image", "detail": "low"}]},
        ],
    }

    content = read_content(body, RESPONSES_BODY)

    assert (content.opaque, content.images, content.low_detail_images) == (1, 1, 1)
    assert "False" not in content.texts


def test_an_opaque_part_holds_the_whole_context_but_text_past_it_is_still_refused():
    short = SentPrompt(PromptContent(texts=["hi"], opaque=1), route(), context_length=1_000)
    long = SentPrompt(
        PromptContent(texts=["word " * 2_000], opaque=1), route(), context_length=1_000
    )

    assert short.bound() == short.count() == 1_000
    assert long.count(limit=1_000) > 1_000


def test_the_bound_is_never_below_the_count():
    content = PromptContent(texts=["héllo wörld " * 50, "日本語のテキスト", "12", json.dumps({})])
    for adapter_class in (AnthropicAdapter, OpenAICompatAdapter):
        prompt = SentPrompt(content, route(adapter_class), context_length=100_000)
        assert prompt.bound() >= prompt.count() > 0


def test_a_low_detail_image_costs_less_only_where_the_upstream_honours_detail():
    content = PromptContent(low_detail_images=1)

    anthropic = SentPrompt(content, route(AnthropicAdapter, image_tokens=1_000), 10_000)
    openai = SentPrompt(content, route(OpenAICompatAdapter, image_tokens=1_000), 10_000)

    assert anthropic.count() == 1_200  # Anthropic's counts run 1.2x cl100k_base's
    assert openai.count() == 85


def test_images_are_refused_for_a_model_without_vision():
    body = {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}

    with pytest.raises(UnsupportedContent):
        sent_prompt(body, MESSAGES_BODY, model(capabilities=()))

    assert sent_prompt(body, MESSAGES_BODY, model()).content.images == 1


def test_a_translated_prompt_is_counted_by_its_route():
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hello"}])
    prompt = TranslatedPrompt(request, route())

    assert prompt.bound() >= prompt.count() > 0
