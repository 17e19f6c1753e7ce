"""What each door's refusals say, read through the SDK its callers use, over real HTTP.

A refusal names the fields of the door it came by: the output cap a 402 suggests lowering
(``max_output_tokens`` on Responses, ``max_tokens`` on Messages, the alias the caller sent
on Chat Completions), and the headers a 401 saw and accepts.
"""

from __future__ import annotations

from decimal import Decimal

import anthropic
import openai
import pytest

HELLO = [{"role": "user", "content": "Hello there"}]
# Enough for a short answer, not for the worst case of thousands of output tokens.
LOW_BALANCE = Decimal("0.001")


@pytest.fixture(autouse=True)
def no_credentials_from_the_environment(monkeypatch, tmp_path):
    """Only the credentials a test gives: none from variables or the SDKs' config files."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def openai_sdk(live_server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=key, max_retries=0)


def anthropic_sdk(live_server, key: str | None = None, **options) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live_server.url, api_key=key, max_retries=0, **options)


def test_a_responses_402_names_max_output_tokens(live_server, make_funded_key):
    poor = make_funded_key(LOW_BALANCE)

    with pytest.raises(openai.APIStatusError) as caught:
        openai_sdk(live_server, poor.key).responses.create(
            model="dev-chat", input="Hello there", max_output_tokens=4000
        )

    assert caught.value.status_code == 402
    message = caught.value.body["message"]
    assert "Set max_output_tokens to at most " in message and "max_tokens" not in message


def test_a_messages_402_names_max_tokens(live_server, make_funded_key):
    poor = make_funded_key(LOW_BALANCE)

    with pytest.raises(anthropic.APIStatusError) as caught:
        anthropic_sdk(live_server, poor.key).messages.create(
            model="dev-chat", max_tokens=4000, messages=HELLO
        )

    assert caught.value.status_code == 402
    assert "Set max_tokens to at most " in caught.value.body["error"]["message"]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_chat_completions_402_names_the_field_the_caller_sent(
    live_server, make_funded_key, field
):
    poor = make_funded_key(LOW_BALANCE)

    with pytest.raises(openai.APIStatusError) as caught:
        openai_sdk(live_server, poor.key).chat.completions.create(
            model="dev-chat", messages=HELLO, **{field: 4000}
        )

    assert caught.value.status_code == 402
    assert caught.value.code == "insufficient_quota"
    message = caught.value.body["message"]
    assert message.startswith("Insufficient credits") and f"Set {field} to at most " in message
