"""google-genai (Google's Gen AI SDK for Python) against the Gemini door, as its users call it.

Only the base URL is set (``HttpOptions(base_url=...)``, without a version: the SDK adds
``v1beta``); the SDK sends its key as ``x-goog-api-key``. It drops fields its types do not
know, so the cost is read from the raw body, which ``should_return_http_response`` keeps.
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from google import genai
from google.genai import errors, types

from tests.contract.conftest import billing_records

WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="Current weather in a city",
    parameters=types.Schema(
        type=types.Type.OBJECT,
        properties={
            "city": types.Schema(type=types.Type.STRING),
            "unit": types.Schema(type=types.Type.STRING, enum=["celsius", "fahrenheit"]),
        },
        required=["city", "unit"],
    ),
)


@pytest.fixture(autouse=True)
def no_credentials_from_the_environment(monkeypatch, tmp_path):
    """Only the credentials a test gives: none from variables."""
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


def sdk(server, key: str, **options) -> genai.Client:
    http = types.HttpOptions(base_url=server.url, retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=key, http_options=http, **options)


@pytest.fixture
def gemini(live_server, funded_key) -> genai.Client:
    return sdk(live_server, funded_key.key)


def charged(app, funded_key) -> tuple[Decimal, list]:
    """Return what the account was charged, and its generation records; nothing left held."""
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert account.reserved == 0 and all(hold.status == "settled" for hold in holds)
    spent = -sum(charge.amount for charge in charges)
    assert account.balance == Decimal("10") - spent
    return spent, generations


def raw_cost(response: types.GenerateContentResponse) -> Decimal:
    """Read usageMetadata.cost.totalCost from the raw body the SDK was told to keep."""
    body = json.loads(response.sdk_http_response.body)
    return Decimal(str(body["usageMetadata"]["cost"]["totalCost"]))


def test_generate_content_answers_and_the_balance_falls_by_the_reported_cost(
    app, gemini, funded_key
):
    response = gemini.models.generate_content(
        model="dev-chat",
        contents="Hello there",
        config=types.GenerateContentConfig(
            system_instruction="Be brief.", max_output_tokens=64, temperature=0.3
        ),
    )
    raw = gemini.models.generate_content(
        model="models/dev-chat",
        contents="Hello again",
        config=types.GenerateContentConfig(should_return_http_response=True),
    )

    assert response.text.startswith("Hello there")
    assert response.candidates[0].finish_reason == types.FinishReason.STOP
    usage = response.usage_metadata
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    assert response.model_version == "dev-chat"
    spent, generations = charged(app, funded_key)
    first = next(g for g in generations if g.id == response.response_id)
    assert first.api == "gemini" and first.prompt_tokens == usage.prompt_token_count
    second = next(g for g in generations if g.id != response.response_id)
    assert raw_cost(raw) == second.cost and spent == first.cost + second.cost


def test_a_stream_reassembles_into_the_answer_and_ends_with_its_usage(app, gemini, funded_key):
    chunks = list(gemini.models.generate_content_stream(model="dev-chat", contents="Hello there"))

    assert len(chunks) > 2
    assert "".join(chunk.text or "" for chunk in chunks).startswith("Hello there")
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count > 0
    _, (generation,) = charged(app, funded_key)
    assert {chunk.response_id for chunk in chunks} == {generation.id}
    assert generation.streamed and generation.completion_tokens == (
        chunks[-1].usage_metadata.candidates_token_count
    )


def test_count_tokens_is_free(app, gemini, funded_key):
    counted = gemini.models.count_tokens(model="dev-chat", contents="Hello there, how are you")

    assert counted.total_tokens > 0
    _, generations = charged(app, funded_key)
    assert generations == []


def test_function_calling_round_trip_in_a_chat_session(app, gemini, funded_key):
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[WEATHER])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
    )
    chat = gemini.chats.create(model="dev-chat", config=config)
    asked = chat.send_message("Call get_weather for Paris")

    (call,) = asked.function_calls
    assert call.name == "get_weather" and set(call.args) == {"city", "unit"}
    assert call.args["unit"] in ("celsius", "fahrenheit")
    result = types.Part.from_function_response(name=call.name, response={"temperature": 21})
    answered = chat.send_message(result)

    assert answered.function_calls is None and answered.text
    assert len(chat.get_history()) == 4
    _, generations = charged(app, funded_key)
    assert len(generations) == 2


def test_models_are_listed_and_fetched(gemini):
    names = [model.name for model in gemini.models.list()]
    model = gemini.models.get(model="dev-chat")

    assert "models/dev-chat" in names and "models/dev-hidden" not in names
    assert (model.name, model.input_token_limit, model.output_token_limit) == (
        "models/dev-chat",
        32768,
        4096,
    )
    assert "generateContent" in model.supported_actions


def test_errors_raise_the_sdks_exceptions(live_server, make_funded_key):
    # A client is kept in a name: one dropped closes its connections while they are in use.
    stranger = sdk(live_server, "sk-wrong")
    with pytest.raises(errors.ClientError) as refused:
        stranger.models.generate_content(model="dev-chat", contents="Hi")
    assert (refused.value.code, refused.value.status) == (401, "UNAUTHENTICATED")

    poor = sdk(live_server, make_funded_key(Decimal("0")).key)
    with pytest.raises(errors.ClientError) as broke:
        poor.models.generate_content(model="dev-chat", contents="Hi")
    assert (broke.value.code, broke.value.status) == (402, "RESOURCE_EXHAUSTED")
    assert broke.value.message.startswith("Insufficient credits")

    with pytest.raises(errors.ClientError) as missing:
        poor.models.generate_content(model="no-such-model", contents="Hi")
    assert (missing.value.code, missing.value.status) == (404, "NOT_FOUND")
