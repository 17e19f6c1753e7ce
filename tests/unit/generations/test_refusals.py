"""What a request's model cannot take, or its balance cannot cover, is refused before it runs."""

from __future__ import annotations

from decimal import Decimal

import pytest

from app.credits.errors import InsufficientCredits
from app.generations import lifecycle
from app.generations.errors import (
    ContextLengthExceeded,
    OutputLimitExceeded,
    UnsupportedContent,
)
from tests.unit.generations.test_lifecycle import caller_with, money, start


@pytest.mark.parametrize(
    ("model_id", "request_fields", "error"),
    [
        (
            "dev-chat-mini",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            UnsupportedContent,
        ),
        ("dev-chat-mini", {"params": {"max_tokens": 2049}}, OutputLimitExceeded),
        (
            "dev-chat-mini",
            {"messages": [{"role": "user", "content": "word " * 20_000}]},
            ContextLengthExceeded,
        ),
    ],
)
def test_what_the_model_cannot_take_is_refused_before_any_hold(
    app_context, model_id, request_fields, error
):
    caller = caller_with("1")

    with pytest.raises(error):
        start(caller, model_id, **request_fields)

    assert money(caller.account_id) == (Decimal("1"), 0)


def test_tool_fields_are_dropped_for_a_model_without_tools(app_context):
    caller = caller_with("1")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]

    generation = start(caller, "dev-slow", params={"tools": tools, "tool_choice": "auto"})

    assert "tools" not in generation.request.params
    assert "tool_choice" not in generation.request.params
    lifecycle.run_generation(generation)


def test_a_hold_the_balance_cannot_cover_says_what_it_could(app_context):
    caller = caller_with("0.0000100")

    with pytest.raises(InsufficientCredits) as refused:
        start(caller, params={"max_tokens": 2000})

    assert "Set max_tokens to at most" in refused.value.message
    assert money(caller.account_id) == (Decimal("0.00001"), 0)
