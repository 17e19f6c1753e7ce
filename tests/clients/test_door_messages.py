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
import requests

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


def test_a_responses_402_under_a_key_limit_names_max_output_tokens(
    app, live_server, make_funded_key
):
    from app.accounts.keys import update_key_limits

    limited = make_funded_key()
    with app.app_context():
        update_key_limits(limited.key_id, permitted_models=None, monthly_limit=LOW_BALANCE)

    with pytest.raises(openai.APIStatusError) as caught:
        openai_sdk(live_server, limited.key).responses.create(
            model="dev-chat", input="Hello there", max_output_tokens=4000
        )

    assert caught.value.status_code == 402
    message = caught.value.body["message"]
    assert "this API key's monthly limit" in message
    assert "Set max_output_tokens to at most " in message and "raise the key's limit" in message


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


def test_a_wrong_key_sent_as_x_api_key_is_named_so_on_messages(live_server):
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic_sdk(
            live_server, default_headers={"X-Api-Key": "sk-gw-not-a-key"}
        ).messages.create(model="dev-chat", max_tokens=20, messages=HELLO)

    message = caught.value.body["error"]["message"]
    assert "the key sent as 'x-api-key' is not an active key" in message
    assert "'x-api-key: <key>' or 'Authorization: Bearer <key>'" in message


def test_a_wrong_bearer_is_named_so_on_messages(live_server):
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic_sdk(live_server, auth_token="sk-gw-not-a-key").messages.create(
            model="dev-chat", max_tokens=20, messages=HELLO
        )

    assert "sent as 'Authorization: Bearer' is not" in caught.value.body["error"]["message"]


def test_a_missing_key_and_a_wrong_key_are_told_apart_on_messages(live_server):
    no_key = requests.post(
        f"{live_server.url}/v1/messages",
        json={"model": "dev-chat", "max_tokens": 20, "messages": HELLO},
        headers={"anthropic-version": "2023-06-01"},
        timeout=30,
    )

    assert no_key.status_code == 401
    assert no_key.json()["error"] == {
        "type": "authentication_error",
        "message": "Incorrect API key provided: the request sent no key. Send it as "
        "'x-api-key: <key>' or 'Authorization: Bearer <key>'.",
    }


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_missing_key_and_a_wrong_key_are_told_apart_on_the_openai_doors(live_server, path):
    body = {"model": "dev-chat", "messages": HELLO, "input": "Hello there"}
    if path == "/v1/responses":
        body.pop("messages")
    else:
        body.pop("input")
    sent = {
        "none": {},
        "basic": {"Authorization": "Basic dXNlcjpwYXNz"},
        "wrong": {"Authorization": "Bearer sk-gw-not-a-key"},
    }

    errors = {
        name: requests.post(f"{live_server.url}{path}", json=body, headers=headers, timeout=30)
        for name, headers in sent.items()
    }

    assert {response.status_code for response in errors.values()} == {401}
    envelopes = {name: response.json()["error"] for name, response in errors.items()}
    assert {error["code"] for error in envelopes.values()} == {"invalid_api_key"}
    messages = {name: error["message"] for name, error in envelopes.items()}
    assert all(message.startswith("Incorrect API key provided") for message in messages.values())
    assert len(set(messages.values())) == 3
    assert "sent no key" in messages["none"]
    assert "does not say 'Bearer <key>'" in messages["basic"]
    assert "sent as 'Authorization: Bearer' is not an active key" in messages["wrong"]


def test_the_openai_sdk_reads_a_wrong_key_as_an_authentication_error(live_server):
    with pytest.raises(openai.AuthenticationError) as caught:
        openai_sdk(live_server, "sk-gw-not-a-key").chat.completions.create(
            model="dev-chat", messages=HELLO
        )

    assert caught.value.code == "invalid_api_key"
    assert "'Authorization: Bearer' is not an active key" in caught.value.body["message"]
