"""Gemini's :embedContent and :batchEmbedContents end to end: gunicorn, google-genai, upstreams.

The gateway serves the built-in ``dev-embed`` and an embedding model on a gemini upstream
(the replay server answering with transcripts of Google's ``:batchEmbedContents``), with
a chat model beside them. google-genai's ``embed_content`` calls ``:batchEmbedContents``
on the Gemini API; ``:embedContent`` is called over plain HTTP. Every answer is checked
against what the ledger and the generation record say.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
import requests
from google import genai
from google.genai import errors, types

from app.catalog.pricing import cost_of
from app.providers.base import PromptContent, Usage
from app.providers.builtin import tokenize
from tests.contract.conftest import billing_records as records
from tests.contract.conftest import gateway_serving
from tests.upstream_server import Reply

KEY = "AIzaSy-test-only-gemini-key-0000000000"
CATALOG = """
[upstreams.google]
kind = "gemini"
base_url = "{url}/google"
api_key_env = "GEMINI_API_KEY"
retries = 0

[[models]]
id = "dev-chat"
max_output_tokens = 256
pricing = {{ prompt = 0.50, completion = 1.50 }}
routes = [{{ upstream = "builtin" }}]

[[models]]
id = "dev-embed"
type = "embedding"
capabilities = ["dimensions"]
aliases = ["dev-embed-latest"]
pricing = {{ prompt = 0.02 }}
routes = [{{ upstream = "builtin" }}]

[[models]]
id = "embed-short"
type = "embedding"
context_length = 8
pricing = {{ prompt = 0.02 }}
routes = [{{ upstream = "builtin" }}]

[[models]]
id = "gemini-embedding"
type = "embedding"
capabilities = ["dimensions"]
pricing = {{ prompt = 0.15 }}
routes = [{{ upstream = "google", model = "gemini-embedding-001" }}]
"""
TWO_TEXTS = ["The food was delicious and the waiter was friendly.", "Paris is in France."]


@pytest.fixture(autouse=True)
def no_credentials_from_the_environment(monkeypatch, tmp_path):
    """Only the credentials a test gives: none from variables."""
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemini-embeddings")
    with gateway_serving(
        CATALOG.format(url=upstream.url), database_url, folder, GEMINI_API_KEY=KEY
    ) as gateway:
        yield gateway


@pytest.fixture(autouse=True)
def scripted(upstream):
    """Every test scripts its upstream replies, and uses all of them."""
    upstream.reset()
    yield upstream
    assert upstream.unused_replies() == {}


@pytest.fixture
def funded(make_funded_key):
    return make_funded_key(Decimal("5"))


@pytest.fixture
def gemini(gateway, funded) -> genai.Client:
    http = types.HttpOptions(base_url=gateway.url, retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=funded.key, http_options=http)


def post(gateway, key, path, body):
    return requests.post(
        f"{gateway.url}{path}", headers={"x-goog-api-key": key}, json=body, timeout=60
    )


def builtin_tokens(texts):
    """The tokens dev-embed counts, and bills, for ``texts``."""
    return sum(len(tokenize(text)) for text in texts)


def assert_charged_at_its_price(gateway, app, funded, prompt_tokens, model_id):
    """Check the one generation: charged the prompt tokens at the model's prompt price."""
    account, (generation,), (charge,), holds = records(app, funded.account_id)
    price = gateway.catalog.resolve(model_id, model_type="embedding").pricing
    cost = cost_of(Usage(prompt_tokens=prompt_tokens), price)
    assert (generation.api, generation.model, generation.status) == (
        "gemini",
        model_id,
        "completed",
    )
    assert (generation.prompt_tokens, generation.completion_tokens) == (prompt_tokens, 0)
    assert generation.cost == cost == -charge.amount > 0
    assert account.balance == Decimal(5) - cost and account.reserved == 0
    assert [hold.status for hold in holds] == ["settled"]
    return generation, cost


def assert_nothing_held(app, funded):
    account, generations, _, holds = records(app, funded.account_id)
    assert (generations, holds, account.balance) == ([], [], Decimal(5))


def test_the_sdk_embeds_several_contents_at_the_counted_tokens_prompt_price(
    gemini, gateway, app, funded
):
    answer = gemini.models.embed_content(model="dev-embed", contents=TWO_TEXTS)

    first, second = (embedding.values for embedding in answer.embeddings)
    assert len(first) == len(second) == 256 and first != second
    openai_door = requests.post(
        f"{gateway.url}/v1/embeddings",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={"model": "dev-embed", "input": TWO_TEXTS},
        timeout=60,
    ).json()
    assert [first, second] == [item["embedding"] for item in openai_door["data"]]
    counted = builtin_tokens(TWO_TEXTS)
    assert answer.usage_metadata.prompt_token_count == counted
    account, generations, charges, _ = records(app, funded.account_id)
    gemini_record = next(g for g in generations if g.api == "gemini")
    price = gateway.catalog.resolve("dev-embed", model_type="embedding").pricing
    assert gemini_record.prompt_tokens == counted
    assert gemini_record.cost == cost_of(Usage(prompt_tokens=counted), price) > 0
    assert sum(-charge.amount for charge in charges) == Decimal(5) - account.balance


def test_one_content_with_an_output_dimensionality_gets_one_shorter_vector(gemini, app, funded):
    answer = gemini.models.embed_content(
        model="models/dev-embed",
        contents="Hello there",
        config=types.EmbedContentConfig(
            output_dimensionality=8, task_type="RETRIEVAL_DOCUMENT", title="A greeting"
        ),
    )

    (embedding,) = answer.embeddings
    assert len(embedding.values) == 8
    assert sum(value * value for value in embedding.values) == pytest.approx(1, abs=1e-6)
    (generation,) = records(app, funded.account_id)[1]
    assert generation.api == "gemini" and generation.prompt_tokens == builtin_tokens(
        ["Hello there"]
    )


@pytest.mark.parametrize("prefix", ["/v1beta", "/v1"])
def test_embed_content_answers_googles_shape_with_the_charge_beside_the_usage(
    gateway, app, funded, prefix
):
    text = "Embeddings, billed exactly."
    answer = post(
        gateway,
        funded.key,
        f"{prefix}/models/dev-embed-latest:embedContent",
        {"model": "models/dev-embed-latest", "content": {"parts": [{"text": text}]}},
    )

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {"embedding", "usageMetadata"}
    assert len(body["embedding"]["values"]) == 256
    usage = body["usageMetadata"]
    assert usage["promptTokenCount"] == builtin_tokens([text])
    _, cost = assert_charged_at_its_price(gateway, app, funded, builtin_tokens([text]), "dev-embed")
    assert Decimal(str(usage["cost"]["totalCost"])) == cost


def test_a_batch_answers_in_the_requests_order_with_one_charge(gateway, app, funded):
    texts = ["alpha beta", "gamma", "alpha beta"]
    answer = post(
        gateway,
        funded.key,
        "/v1beta/models/dev-embed:batchEmbedContents",
        {"requests": [{"content": {"parts": [{"text": text}]}} for text in texts]},
    )

    assert answer.status_code == 200, answer.text
    vectors = [embedding["values"] for embedding in answer.json()["embeddings"]]
    assert len(vectors) == 3 and vectors[0] == vectors[2] != vectors[1]
    assert_charged_at_its_price(gateway, app, funded, builtin_tokens(texts), "dev-embed")


def test_an_unknown_model_is_a_404_and_a_chat_model_a_400_naming_its_type(gemini, app, funded):
    with pytest.raises(errors.ClientError) as unknown:
        gemini.models.embed_content(model="no-such-model", contents=["a"])
    with pytest.raises(errors.ClientError) as chat:
        gemini.models.embed_content(model="dev-chat", contents=["a"])

    assert (unknown.value.code, unknown.value.status) == (404, "NOT_FOUND")
    assert (chat.value.code, chat.value.status) == (400, "INVALID_ARGUMENT")
    assert "'dev-chat' is a chat model" in chat.value.message
    with pytest.raises(errors.ClientError) as generate:
        gemini.models.generate_content(model="dev-embed", contents="Hello")
    assert (generate.value.code, generate.value.status) == (400, "INVALID_ARGUMENT")
    assert "is an embedding model" in generate.value.message
    assert ":embedContent" in generate.value.message
    assert_nothing_held(app, funded)


def test_too_many_inputs_or_one_too_long_is_refused_before_anything_is_held(
    gemini, gateway, app, funded
):
    with pytest.raises(errors.ClientError) as too_many:
        gemini.models.embed_content(model="dev-embed", contents=["a"] * 2049)
    too_long = post(
        gateway,
        funded.key,
        "/v1beta/models/embed-short:batchEmbedContents",
        {"requests": [{"content": {"parts": [{"text": t}]}} for t in ("a b", "a b c d e f g h i")]},
    )

    assert too_many.value.code == 400 and "from 1 to 2048 requests" in too_many.value.message
    assert too_long.status_code == 400
    assert too_long.json()["error"]["status"] == "INVALID_ARGUMENT"
    assert too_long.json()["error"]["message"].startswith("requests[1].content is longer")
    assert_nothing_held(app, funded)


def test_2048_inputs_are_embedded_in_one_request(gemini):
    answer = gemini.models.embed_content(
        model="dev-embed", contents=[f"item {i}" for i in range(2048)]
    )

    assert len(answer.embeddings) == 2048


TEXT = {"parts": [{"text": "a"}]}
IMAGE = {"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}
REFUSED = [
    ("embed-short", {"content": TEXT, "outputDimensionality": 8}, "outputDimensionality"),
    ("dev-embed", {"content": IMAGE}, "content.parts[0]"),
    ("dev-embed", {"content": {"parts": [{"text": ""}]}}, "content must hold some text"),
    ("dev-embed", {"content": TEXT, "taskType": "SEARCH"}, "taskType"),
    ("dev-embed", {"model": "models/embed-short", "content": TEXT}, "model"),
    ("dev-embed", {"parts": [{"text": "a"}]}, "content"),
]


@pytest.mark.parametrize(("model", "body", "named"), REFUSED)
def test_a_body_google_would_refuse_is_a_400_in_googles_envelope(
    gateway, app, funded, model, body, named
):
    answer = post(gateway, funded.key, f"/v1beta/models/{model}:embedContent", body)

    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert named in error["message"]
    assert_nothing_held(app, funded)


def test_a_batch_asks_for_one_vector_size(gateway, app, funded):
    content = {"parts": [{"text": "a"}]}
    answer = post(
        gateway,
        funded.key,
        "/v1beta/models/dev-embed:batchEmbedContents",
        {"requests": [{"content": content}, {"content": content, "outputDimensionality": 8}]},
    )

    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("requests[1].outputDimensionality")
    assert_nothing_held(app, funded)


def test_the_model_list_offers_embedding_models_their_methods(gemini):
    model = gemini.models.get(model="dev-embed")
    chat = gemini.models.get(model="dev-chat")

    assert model.supported_actions == ["embedContent", "batchEmbedContents"]
    assert model.output_token_limit == 1
    assert "generateContent" in chat.supported_actions


def sent_to_google(scripted):
    """Return the one batchEmbedContents request Google's API received, with the key."""
    (exchange,) = scripted.exchanges
    assert exchange.path == "/google/v1beta/models/gemini-embedding-001:batchEmbedContents"
    assert exchange.headers["x-goog-api-key"] == KEY
    return exchange.json


def test_a_gemini_upstream_is_asked_in_a_batch_and_billed_its_reported_tokens(
    gemini, gateway, scripted, app, funded
):
    scripted.script("/google", Reply("gemini_batch_embed"))

    answer = gemini.models.embed_content(
        model="gemini-embedding",
        contents=TWO_TEXTS,
        config=types.EmbedContentConfig(
            output_dimensionality=4, task_type="RETRIEVAL_DOCUMENT", title="Notes"
        ),
    )

    assert [embedding.values for embedding in answer.embeddings] == [
        pytest.approx([0.0123, -0.0456, 0.0789, -0.0012], rel=1e-6),
        pytest.approx([-0.0321, 0.0654, -0.0987, 0.0021], rel=1e-6),
    ]
    sent = sent_to_google(scripted)
    assert sent == {
        "requests": [
            {
                "model": "models/gemini-embedding-001",
                "content": {"parts": [{"text": text}]},
                "taskType": "RETRIEVAL_DOCUMENT",
                "title": "Notes",
                "outputDimensionality": 4,
            }
            for text in TWO_TEXTS
        ]
    }
    assert answer.usage_metadata.prompt_token_count == 17
    generation, _ = assert_charged_at_its_price(gateway, app, funded, 17, "gemini-embedding")
    assert generation.estimated is False


def test_a_gemini_upstream_answer_without_usage_is_billed_at_the_counted_inputs(
    gateway, scripted, app, funded
):
    scripted.script("/google", Reply("gemini_batch_embed_no_usage"))

    # Through the OpenAI door: the gemini upstream serves every door's embedding requests.
    answer = requests.post(
        f"{gateway.url}/v1/embeddings",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={"model": "gemini-embedding", "input": TWO_TEXTS},
        timeout=60,
    )

    assert answer.status_code == 200, answer.text
    assert sent_to_google(scripted)["requests"][1]["content"] == {"parts": [{"text": TWO_TEXTS[1]}]}
    route = gateway.catalog.resolve("gemini-embedding", model_type="embedding").routes[0]
    counted = route.adapter.count_content_tokens(PromptContent(texts=TWO_TEXTS), route.target)
    assert answer.json()["usage"]["prompt_tokens"] == counted
    account, (generation,), (charge,), _ = records(app, funded.account_id)
    price = gateway.catalog.resolve("gemini-embedding", model_type="embedding").pricing
    assert (generation.api, generation.prompt_tokens, generation.estimated) == (
        "embeddings",
        counted,
        True,
    )
    assert generation.cost == cost_of(Usage(prompt_tokens=counted), price) == -charge.amount


def test_token_ids_are_refused_by_a_gemini_upstream_and_cost_nothing(gateway, app, funded):
    answer = requests.post(
        f"{gateway.url}/v1/embeddings",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={"model": "gemini-embedding", "input": [[1, 2, 3]]},
        timeout=60,
    )

    assert answer.status_code == 400, answer.text
    assert "not token ids" in answer.json()["error"]["message"]
    account, _, charges, holds = records(app, funded.account_id)
    assert charges == [] and account.balance == Decimal(5)
    assert all(hold.status != "held" for hold in holds)


def test_the_text_parts_of_one_content_are_embedded_as_one_text(gateway, funded):
    answer = post(
        gateway,
        funded.key,
        "/v1beta/models/dev-embed:batchEmbedContents",
        {"requests": [{"content": {"parts": [{"text": "red apple"}, {"text": "pie"}]}}]},
    )
    joined = post(
        gateway,
        funded.key,
        "/v1beta/models/dev-embed:embedContent",
        {"content": {"parts": [{"text": "red apple\npie"}]}},
    )

    assert answer.status_code == joined.status_code == 200, answer.text
    (vector,) = answer.json()["embeddings"]
    assert vector == joined.json()["embedding"]


def test_an_idempotency_key_embeds_once(gateway, app, funded):
    headers = {"x-goog-api-key": funded.key, "Idempotency-Key": "gemini-embed-once"}
    body = {"requests": [{"content": {"parts": [{"text": "once only"}]}}]}
    url = f"{gateway.url}/v1beta/models/dev-embed:batchEmbedContents"

    first = requests.post(url, headers=headers, json=body, timeout=60)
    again = requests.post(url, headers=headers, json=body, timeout=60)

    assert first.status_code == again.status_code == 200, first.text
    assert first.json() == again.json()
    tokens = builtin_tokens(["once only"])
    generation, _ = assert_charged_at_its_price(gateway, app, funded, tokens, "dev-embed")
    assert generation.id.startswith("embd-"), "an embedding's record, named as one"
