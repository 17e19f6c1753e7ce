"""LangChain's ChatOpenAI (langchain-openai) against the gateway, unchanged but for base_url."""

from __future__ import annotations

import pytest
from langchain_openai import ChatOpenAI, OpenAIEmbeddings
from pydantic import BaseModel

from tests.contract.conftest import billing_records


@pytest.fixture
def llm(base_url, funded_key) -> ChatOpenAI:
    return ChatOpenAI(
        model="dev-chat",
        base_url=base_url,
        api_key=funded_key.key,
        max_retries=0,
        timeout=30,
        stream_usage=True,
    )


def test_invoke_answers_with_usage_and_the_cost(llm):
    message = llm.invoke("Hello")

    assert message.content.startswith("Hello")
    token_usage = message.response_metadata["token_usage"]
    assert token_usage["cost"]["total_cost"] > 0
    assert message.usage_metadata["total_tokens"] == token_usage["total_tokens"]
    assert isinstance(message.response_metadata["system_fingerprint"], str)


def test_stream_delivers_the_answer_and_its_usage_last(llm):
    chunks = list(llm.stream("Hello"))

    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert len(chunks) > 3
    assert whole.content.startswith("Hello")
    assert whole.response_metadata["finish_reason"] == "stop"
    usage = whole.usage_metadata
    assert usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def get_weather(city: str, unit: str) -> str:
    """Current weather in a city."""
    return f"18 degrees {unit} in {city}"


def test_bind_tools_gets_a_tool_call(llm):
    message = llm.bind_tools([get_weather]).invoke("Use get_weather for Paris")

    (call,) = message.tool_calls
    assert call["name"] == "get_weather"
    assert set(call["args"]) == {"city", "unit"}
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.response_metadata["token_usage"]["cost"]["total_cost"] > 0


class CityWeather(BaseModel):
    city: str
    temperature_celsius: float
    raining: bool


def test_with_structured_output_returns_the_pydantic_model(llm):
    result = llm.with_structured_output(CityWeather, include_raw=True).invoke("Weather in Paris")

    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], CityWeather)
    raw = result["raw"]
    assert CityWeather.model_validate_json(raw.content) == result["parsed"]
    assert raw.response_metadata["token_usage"]["cost"]["total_cost"] > 0


def test_openai_embeddings_batches_the_texts_and_gets_the_sdks_vectors(
    base_url, funded_key, client, app
):
    embeddings = OpenAIEmbeddings(
        model="dev-embed",
        base_url=base_url,
        api_key=funded_key.key,
        max_retries=0,
        # Its default splits texts with tiktoken, whose encodings are downloaded: no network.
        check_embedding_ctx_length=False,
        chunk_size=2,
    )
    texts = ["red apple pie", "red apple tart", "quantum tunnel", "river stone", "pie"]

    vectors = embeddings.embed_documents(texts)
    query = embeddings.embed_query("pie")

    from_sdk = client.embeddings.create(model="dev-embed", input=texts, encoding_format="float")
    assert vectors == [item.embedding for item in from_sdk.data]
    assert query == vectors[4]
    _, generations, charges, _ = billing_records(app, funded_key.account_id)
    assert len(generations) == len(charges) == 5
    assert {generation.api for generation in generations} == {"embeddings"}
    # Three batches of at most two texts (6, 4 and 1 tokens), the query (1), the SDK's (11).
    assert sorted(g.prompt_tokens for g in generations) == [1, 1, 4, 6, 11]
