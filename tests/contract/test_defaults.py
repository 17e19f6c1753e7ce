"""What a developer's first calls get without setting anything: the catalog's defaults."""

from __future__ import annotations

HELLO = [{"role": "user", "content": "Hello there"}]


def test_dev_chat_answers_a_small_max_tokens_without_spending_it_on_reasoning(sdk):
    response = sdk.chat.completions.create(model="dev-chat", messages=HELLO, max_tokens=40)

    message = response.choices[0].message
    assert message.content.startswith("Hello there")
    assert not (message.model_extra or {}).get("reasoning")
    assert response.usage.completion_tokens_details.reasoning_tokens == 0


def test_reasoning_effort_still_turns_reasoning_on(sdk):
    response = sdk.chat.completions.create(
        model="dev-chat", messages=HELLO, max_tokens=40, reasoning_effort="low"
    )

    assert response.choices[0].message.model_extra["reasoning"]
    assert response.usage.completion_tokens_details.reasoning_tokens == 16
