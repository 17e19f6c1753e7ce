"""anthropic-python against the Messages door, as its users call it: only the base URL set.

The SDK (pinned in requirements-dev.txt) sends its key as a bearer (``api_key`` and
``auth_token`` alike) unless told to send ``X-Api-Key``; it appends /v1/messages itself.
"""

from __future__ import annotations

from decimal import Decimal

import anthropic
import pytest

from tests.conftest import running_server
from tests.contract.conftest import billing_records

HELLO = [{"role": "user", "content": "Hello there"}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
    },
}


@pytest.fixture(autouse=True)
def no_credentials_from_the_environment(monkeypatch, tmp_path):
    """Only the credentials a test gives: none from variables or the SDK's config files."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def sdk(server, key: str | None = None, **options) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=key, max_retries=0, timeout=30, **options
    )


@pytest.fixture
def claude(live_server, funded_key) -> anthropic.Anthropic:
    return sdk(live_server, funded_key.key)


def cost_of(usage) -> Decimal:
    """Read the gateway's usage.cost.total_cost where the SDK keeps fields it does not know."""
    return Decimal(str(usage.model_extra["cost"]["total_cost"]))


def charged(app, funded_key) -> tuple[Decimal, list]:
    """Return what the account was charged, and its generation records."""
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert account.reserved == 0 and all(hold.status == "settled" for hold in holds)
    assert account.balance == Decimal("10") + sum(charge.amount for charge in charges)
    return -sum(charge.amount for charge in charges), generations


def test_create_answers_and_the_cost_it_reports_is_the_ledgers_debit(app, claude, funded_key):
    message = claude.messages.create(model="dev-chat", max_tokens=32000, messages=HELLO)

    assert message.id.startswith("msg_") and message.model == "dev-chat"
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text"
    assert message.content[0].text.startswith("Hello there")
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message._request_id.startswith("req_")
    total, (generation,) = charged(app, funded_key)
    assert cost_of(message.usage) == total == generation.cost > 0
    assert (generation.id, generation.api) == (message.id, "messages")
    assert message.usage.input_tokens == generation.prompt_tokens
    assert message.usage.output_tokens == generation.completion_tokens


def test_stream_delivers_text_events_and_its_cost(app, claude, funded_key):
    with claude.messages.stream(
        model="dev-chat", max_tokens=200, messages=HELLO, extra_body={"temperature": 0}
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()

    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds[-2] == "message_delta" and "ping" not in kinds  # the SDK drops pings
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    text = "".join(event.text for event in events if event.type == "text")
    assert text == final.content[0].text and text.startswith("Hello there")
    whole = claude.messages.create(
        model="dev-chat", max_tokens=200, messages=HELLO, extra_body={"temperature": 0}
    )
    assert whole.content[0].text == text
    (delta,) = [event for event in events if event.type == "message_delta"]
    total, generations = charged(app, funded_key)
    assert sorted(generation.streamed for generation in generations) == [False, True]
    assert cost_of(delta.usage) + cost_of(whole.usage) == total
    assert final.usage.output_tokens == delta.usage.output_tokens == whole.usage.output_tokens
    assert final.stop_reason == "end_turn"


def test_an_answer_cut_at_a_stop_sequence_names_it_whole_and_streamed(claude):
    # The built-in model echoes the prompt: "there" comes before anything else asked for.
    asked = {"model": "dev-chat", "max_tokens": 200, "messages": HELLO}
    stops = ["Ticket", "there", "never said"]

    whole = claude.messages.create(**asked, stop_sequences=stops)
    with claude.messages.stream(**asked, stop_sequences=stops) as stream:
        (delta,) = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    plain = claude.messages.create(**asked)

    assert whole.content[0].text == "Hello "
    assert (whole.stop_reason, whole.stop_sequence) == ("stop_sequence", "there")
    assert (delta.delta.stop_reason, delta.delta.stop_sequence) == ("stop_sequence", "there")
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "there")
    assert (plain.stop_reason, plain.stop_sequence) == ("end_turn", None)


def test_an_answer_cut_at_max_tokens_before_its_stop_sequence_names_none(claude):
    message = claude.messages.create(
        model="dev-chat", max_tokens=1, messages=HELLO, stop_sequences=["there"]
    )

    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)


def test_a_tool_use_then_tool_result_round_trip(claude):
    messages = [{"role": "user", "content": "What is the weather in Paris? Use get_weather."}]
    first = claude.messages.create(
        model="dev-chat", max_tokens=500, messages=messages, tools=[WEATHER]
    )

    assert first.stop_reason == "tool_use"
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather" and call.input["unit"] in {"celsius", "fahrenheit"}
    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18 C"}],
        },
    ]
    answer = claude.messages.create(
        model="dev-chat", max_tokens=500, messages=messages, tools=[WEATHER]
    )

    assert answer.stop_reason == "end_turn"
    assert answer.content[0].text.startswith("Tool result received: 18 C")


def test_a_streamed_tool_use_reassembles_its_input(claude):
    with claude.messages.stream(
        model="dev-chat",
        max_tokens=500,
        messages=[{"role": "user", "content": "Use get_weather for Lyon"}],
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        partial = [event.partial_json for event in stream if event.type == "input_json"]
        final = stream.get_final_message()

    (call,) = final.content
    assert call.type == "tool_use" and set(call.input) == {"city", "unit"}
    assert len(partial) > 1 and final.stop_reason == "tool_use"


def test_count_tokens_counts_as_the_model_does_and_costs_nothing(app, claude, funded_key):
    counted = claude.messages.count_tokens(model="dev-chat", messages=HELLO, tools=[WEATHER])
    beta = claude.beta.messages.count_tokens(model="dev-chat", messages=HELLO, tools=[WEATHER])

    assert counted.input_tokens == beta.input_tokens > 0
    assert charged(app, funded_key) == (0, [])
    message = claude.messages.create(
        model="dev-chat", max_tokens=50, messages=HELLO, tools=[WEATHER]
    )
    assert counted.input_tokens == message.usage.input_tokens


def test_thinking_comes_as_a_signed_thinking_block_before_the_text(claude):
    thinking = {"type": "enabled", "budget_tokens": 8000}
    message = claude.messages.create(
        model="dev-chat", max_tokens=9000, messages=HELLO, thinking=thinking
    )
    with claude.messages.stream(
        model="dev-chat", max_tokens=9000, messages=HELLO, thinking=thinking
    ) as stream:
        kinds = [event.type for event in stream]
        streamed = stream.get_final_message()

    for answer in (message, streamed):
        assert [block.type for block in answer.content] == ["thinking", "text"]
        assert answer.content[0].thinking.startswith("Considering the request")
        assert answer.content[0].signature
    assert "thinking" in kinds and "signature" in kinds
    assert message.usage.output_tokens > 48  # the medium trace's 48 tokens, and the text


def test_claude_codes_system_turn_is_an_instruction_not_a_tool_request(claude):
    """A system turn naming the tools, last in messages, must not make the model call them."""
    messages = [
        {"role": "user", "content": "Say hello"},
        {"role": "system", "content": "You may use get_weather when asked."},
    ]

    message = claude.beta.messages.create(
        model="dev-chat",
        max_tokens=32000,
        messages=messages,
        tools=[WEATHER],
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"effort": "high"},
        betas=["claude-code-20250219", "context-management-2025-06-27"],
    )

    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "" and message.content[0].signature
    assert message.content[1].text.startswith("Say hello")
    assert message.stop_reason == "end_turn"


def test_the_key_is_read_from_either_header(live_server, funded_key):
    bearer = sdk(live_server, auth_token=funded_key.key)
    api_key_header = sdk(live_server, default_headers={"X-Api-Key": funded_key.key})

    for client, header in ((bearer, "authorization"), (api_key_header, "x-api-key")):
        raw = client.messages.with_raw_response.create(
            model="dev-chat-mini", max_tokens=20, messages=HELLO
        )
        assert raw.status_code == 200 and raw.parse().content[0].text.startswith("Hello")
        sent = {name.lower() for name in raw.http_request.headers}
        assert header in sent and ({"authorization", "x-api-key"} - {header}).isdisjoint(sent)


def envelope(error: anthropic.APIStatusError) -> dict:
    body = error.response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    return body["error"]


def test_a_wrong_key_is_an_authentication_error_not_worth_retrying(live_server):
    with pytest.raises(anthropic.AuthenticationError) as caught:
        sdk(live_server, "sk-gw-not-a-key").messages.create(
            model="dev-chat", max_tokens=20, messages=HELLO
        )

    assert envelope(caught.value)["type"] == "authentication_error"
    assert caught.value.response.headers["x-should-retry"] == "false"


def test_a_revoked_key_and_a_model_not_permitted_are_permission_errors(
    app, live_server, make_funded_key
):
    from app.accounts.keys import revoke_key, update_key_limits

    limited, revoked = make_funded_key(), make_funded_key()
    with app.app_context():
        update_key_limits(limited.key_id, permitted_models=["dev-chat-mini"], monthly_limit=None)
        revoke_key(revoked.key_id)

    for key, model in ((limited.key, "dev-chat"), (revoked.key, "dev-chat-mini")):
        with pytest.raises(anthropic.PermissionDeniedError) as caught:
            sdk(live_server, key).messages.create(model=model, max_tokens=20, messages=HELLO)
        assert envelope(caught.value)["type"] == "permission_error"


def test_an_unknown_model_is_not_found(claude):
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.messages.create(model="claude-opus-5-5", max_tokens=20, messages=HELLO)

    error = envelope(caught.value)
    assert error["type"] == "not_found_error"
    assert "claude-opus-5-5" in error["message"] and "does not exist" in error["message"]


def test_a_bad_body_is_a_bad_request_error(claude):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="dev-chat", max_tokens=0, messages=HELLO)

    assert envelope(caught.value) == {
        "type": "invalid_request_error",
        "message": "max_tokens must be between 1 and 1000000.",
    }


def test_credits_too_low_are_a_402_billing_error(app, live_server, make_funded_key):
    poor = make_funded_key(Decimal("0.000001"))

    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk(live_server, poor.key).messages.create(
            model="dev-chat", max_tokens=4000, messages=HELLO
        )

    assert caught.value.status_code == 402
    error = envelope(caught.value)
    assert error["type"] == "billing_error" and "Insufficient credits" in error["message"]
    assert billing_records(app, poor.account_id)[1] == []


def test_over_the_rate_limit_is_a_rate_limit_error_with_retry_after(
    app, database_url, tmp_path, funded_key
):
    with running_server(database_url, tmp_path, RATE_LIMIT="1 per 2 second") as server:
        client = sdk(server, funded_key.key)
        client.messages.create(model="dev-chat-mini", max_tokens=20, messages=HELLO)
        with pytest.raises(anthropic.RateLimitError) as caught:
            client.messages.create(model="dev-chat-mini", max_tokens=20, messages=HELLO)

    assert envelope(caught.value)["type"] == "rate_limit_error"
    assert 1 <= int(caught.value.response.headers["retry-after"]) <= 2


def test_a_stream_broken_midway_raises_the_error_event_and_bills_what_was_delivered(
    app, claude, funded_key
):
    texts = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with claude.messages.stream(model="dev-dying", max_tokens=200, messages=HELLO) as stream:
            texts.extend(stream.text_stream)

    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "api_error",
            "message": "The builtin upstream failed mid-stream (fail_after_tokens).",
        },
    }
    assert len(texts) == 5
    total, (generation,) = charged(app, funded_key)
    assert generation.completion_tokens == 5 and generation.cost == total > 0


def test_the_model_list_pages_in_anthropics_shape(claude):
    listed = [model.id for model in claude.models.list(limit=2)]
    model = claude.models.retrieve("dev-chat")

    assert listed == ["dev-chat", "dev-chat-mini", "dev-slow", "dev-dying"]
    assert (model.type, model.display_name) == ("model", "dev-chat")
    assert model.created_at.year == 2023
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude.models.retrieve("dev-hidden")
    assert envelope(caught.value)["type"] == "not_found_error"
