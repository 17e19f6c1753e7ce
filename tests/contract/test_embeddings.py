"""POST /v1/embeddings end to end: gunicorn, the openai SDK, the built-in model and real upstreams.

The gateway runs on a catalog of embedding models served by the built-in ``dev-embed``
rules and by OpenAI-compatible upstreams (the replay server answering with transcripts of
OpenAI's, vLLM's and Text Embeddings Inference's ``/v1/embeddings``), with chat models
beside them. Every answer is checked against what the ledger and the generation record say.
"""

from __future__ import annotations

import base64
import json
import math
from array import array
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import openai
import pytest
import requests

from app.catalog.pricing import cost_of
from app.providers.base import Usage
from app.providers.tokens import count_text, encoding_named
from tests.contract.conftest import billing_records as records
from tests.contract.conftest import gateway_serving
from tests.upstream_server import Reply, load_transcript

THIRD_KEY = "sk-third-embeddings-test-secret"
METRICS_TOKEN = "metrics-token-for-embeddings"
CATALOG = """
[upstreams.own]
kind = "openai"
base_url = "{url}/own/v1"
retries = 0

[upstreams.third]
kind = "openai"
base_url = "{url}/third/v1"
api_key_env = "THIRD_API_KEY"
retries = 0

[upstreams.tei]
kind = "openai"
base_url = "{url}/tei/v1"
retries = 0
embeddings_format = "float"

[upstreams.builtin-down]
kind = "builtin"
fail_after_tokens = 0
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
id = "embed-dear"
type = "embedding"
pricing = {{ prompt = 10000 }}
routes = [{{ upstream = "builtin" }}]

[[models]]
id = "embed-short"
type = "embedding"
context_length = 8
pricing = {{ prompt = 0.02 }}
routes = [{{ upstream = "builtin" }}]

[[models]]
id = "embed-failover"
type = "embedding"
pricing = {{ prompt = 0.02 }}
routes = [{{ upstream = "builtin-down" }}, {{ upstream = "builtin", model = "dev-embed" }}]

[[models]]
id = "text-embedding-3-small"
type = "embedding"
capabilities = ["dimensions"]
pricing = {{ prompt = 0.02 }}
routes = [{{ upstream = "third", model = "text-embedding-3-small" }}]

[[models]]
id = "bge-m3"
type = "embedding"
pricing = {{ prompt = 0.01 }}
routes = [{{ upstream = "own", model = "BAAI/bge-m3" }}]

[[models]]
id = "bge-large"
type = "embedding"
pricing = {{ prompt = 0.01 }}
routes = [{{ upstream = "tei", model = "BAAI/bge-large-en-v1.5" }}]
"""
TWO_TEXTS = ["The food was delicious and the waiter was friendly.", "Paris is in France."]


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("embeddings")
    with gateway_serving(
        CATALOG.format(url=upstream.url),
        database_url,
        folder,
        THIRD_API_KEY=THIRD_KEY,
        METRICS_TOKEN=METRICS_TOKEN,
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
def client(gateway, funded):
    return openai.OpenAI(
        base_url=f"{gateway.url}/v1", api_key=funded.key, max_retries=0, timeout=30
    )


def post(gateway, key, body, path="/v1/embeddings", **headers):
    return requests.post(
        f"{gateway.url}{path}",
        headers={"Authorization": f"Bearer {key}", **headers},
        json=body,
        timeout=60,
    )


def float32(values):
    return array("f", values).tolist()


def norm(vector):
    return math.sqrt(sum(value * value for value in vector))


def assert_charged_at_its_price(gateway, app, funded, prompt_tokens, model_id, *, start="5"):
    account, generations, charges, holds = records(app, funded.account_id)
    (generation,) = generations
    (charge,) = charges
    price = gateway.catalog.resolve(model_id, model_type="embedding").pricing
    cost = cost_of(Usage(prompt_tokens=prompt_tokens), price)
    assert (generation.api, generation.model, generation.status) == (
        "embeddings",
        model_id,
        "completed",
    )
    assert (generation.prompt_tokens, generation.completion_tokens) == (prompt_tokens, 0)
    assert generation.cost == cost == -charge.amount
    assert account.balance == Decimal(start) - cost
    assert all(hold.status != "held" for hold in holds)
    return generation, cost


def test_the_sdk_gets_the_same_vectors_as_floats_and_as_base64(client, gateway, app, funded):
    as_floats = client.embeddings.create(
        model="dev-embed", input=TWO_TEXTS, encoding_format="float"
    )
    # The SDK asks for base64 by default and decodes it itself.
    as_base64 = client.embeddings.create(model="dev-embed", input=TWO_TEXTS)

    assert [item.index for item in as_floats.data] == [0, 1]
    assert [item.embedding for item in as_floats.data] == [
        item.embedding for item in as_base64.data
    ]
    first, second = (item.embedding for item in as_floats.data)
    assert len(first) == 256 and first != second
    assert abs(norm(first) - 1) < 1e-6
    assert as_floats.model == "dev-embed"
    usage = as_floats.model_dump()["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0
    assert usage["cost"]["total_cost"] > 0
    account, generations, charges, _ = records(app, funded.account_id)
    assert len(generations) == len(charges) == 2
    assert all(
        g.api == "embeddings" and g.prompt_tokens == usage["prompt_tokens"] for g in generations
    )
    assert sum(-charge.amount for charge in charges) == Decimal(5) - account.balance


def test_the_same_text_gets_the_same_vector_and_texts_sharing_words_point_alike(client):
    vectors = [
        item.embedding
        for item in client.embeddings.create(
            model="dev-embed",
            input=["red apple pie", "red apple tart", "quantum tunnel physics", "red apple pie"],
        ).data
    ]

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert vectors[0] == vectors[3]
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])


def test_token_ids_and_arrays_of_them_are_embedded_one_vector_per_array(gateway, funded):
    one = post(gateway, funded.key, {"model": "dev-embed", "input": [1, 2, 3]}).json()
    many = post(gateway, funded.key, {"model": "dev-embed", "input": [[1, 2, 3], [4, 5]]}).json()

    assert len(one["data"]) == 1 and len(many["data"]) == 2
    assert one["data"][0]["embedding"] == many["data"][0]["embedding"]
    assert one["usage"]["prompt_tokens"] == 3 and many["usage"]["prompt_tokens"] == 5


def test_a_single_string_and_an_alias_answer_under_the_models_id(gateway, app, funded):
    answer = post(
        gateway, funded.key, {"model": "dev-embed-latest", "input": "Hello there", "user": "u-1"}
    )

    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "list" and body["model"] == "dev-embed"
    assert body["data"][0]["object"] == "embedding"
    assert set(body["usage"]) == {"prompt_tokens", "total_tokens", "cost"}
    assert_charged_at_its_price(gateway, app, funded, body["usage"]["prompt_tokens"], "dev-embed")


def test_dimensions_shorten_the_vector_on_a_model_that_takes_them(client, gateway, funded):
    short = client.embeddings.create(model="dev-embed", input="Hello there", dimensions=8)
    too_long = post(gateway, funded.key, {"model": "dev-embed", "input": "Hi", "dimensions": 300})
    not_taken = post(gateway, funded.key, {"model": "bge-m3", "input": "Hi", "dimensions": 8})

    assert len(short.data[0].embedding) == 8
    assert abs(norm(short.data[0].embedding) - 1) < 1e-6
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "dimensions"
    assert not_taken.status_code == 400
    assert not_taken.json()["error"]["code"] == "unsupported_parameter"
    assert not_taken.json()["error"]["param"] == "dimensions"


def test_a_model_of_the_other_type_is_refused_naming_its_type(gateway, funded, app):
    hello = [{"role": "user", "content": "Hello"}]
    chat = post(
        gateway, funded.key, {"model": "dev-embed", "messages": hello}, "/v1/chat/completions"
    )
    responses = post(gateway, funded.key, {"model": "dev-embed", "input": "Hi"}, "/v1/responses")
    messages = post(
        gateway,
        funded.key,
        {"model": "dev-embed", "max_tokens": 10, "messages": hello},
        "/v1/messages",
    )
    embeddings = post(gateway, funded.key, {"model": "dev-chat", "input": "Hi"})

    for answer in (chat, responses, embeddings):
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("wrong_model_type", "model")
    assert "is an embedding model" in chat.json()["error"]["message"]
    assert "is an embedding model" in responses.json()["error"]["message"]
    assert "is a chat model" in embeddings.json()["error"]["message"]
    assert messages.status_code == 400 and messages.json()["type"] == "error"
    assert "is an embedding model" in messages.json()["error"]["message"]
    assert records(app, funded.account_id)[1] == []


def test_the_model_list_shows_embedding_models_with_their_type(client):
    models = {model.id: model.model_dump() for model in client.models.list()}

    assert models["dev-embed"]["type"] == "embedding"
    assert models["dev-embed"]["capabilities"] == ["dimensions"]
    assert models["dev-chat"]["type"] == "chat"
    assert "dev-embed-latest" not in models


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "dev-embed", "input": ["a"] * 2049}, "input"),
        ({"model": "dev-embed", "input": []}, "input"),
        ({"model": "dev-embed", "input": ""}, "input[0]"),
        ({"model": "dev-embed", "input": ["a", 1]}, "input[1]"),
        ({"model": "dev-embed", "input": [[1], []]}, "input[1]"),
        ({"model": "dev-embed", "input": [[1, -1]]}, "input[0]"),
        ({"model": "dev-embed", "input": [[1, 2**40]]}, "input[0]"),
        ({"model": "dev-embed", "input": {"text": "a"}}, "input"),
        ({"model": "dev-embed"}, "input"),
        ({"model": "dev-embed", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "dev-embed", "input": "a", "dimensions": 0}, "dimensions"),
        ({"model": "dev-embed", "input": "a", "user": 7}, "user"),
        ({"input": "a"}, "model"),
    ],
)
def test_malformed_bodies_are_refused_in_the_envelope_before_anything_is_held(
    gateway, app, funded, body, param
):
    answer = post(gateway, funded.key, body)

    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    account, generations, _, holds = records(app, funded.account_id)
    assert (generations, holds, account.balance) == ([], [], Decimal(5))


def test_2048_inputs_are_embedded_in_one_request(client):
    answer = client.embeddings.create(model="dev-embed", input=[f"item {i}" for i in range(2048)])

    assert [item.index for item in answer.data] == list(range(2048))


def test_a_body_too_large_is_refused_with_413_before_anything_is_held(gateway, app, funded):
    answer = post(gateway, funded.key, {"model": "dev-embed", "input": "x" * (17 * 1024 * 1024)})

    assert answer.status_code == 413
    assert set(answer.json()["error"]) == {"message", "type", "code", "param"}
    account, generations, _, holds = records(app, funded.account_id)
    assert (generations, holds, account.balance) == ([], [], Decimal(5))


def test_each_input_must_fit_the_context_length_but_together_they_may_not(gateway, app, funded):
    fits = post(gateway, funded.key, {"model": "embed-short", "input": ["one two three four"] * 4})
    too_long = post(
        gateway, funded.key, {"model": "embed-short", "input": ["one two", "a b c d e f g h i"]}
    )

    assert fits.status_code == 200, fits.text
    assert fits.json()["usage"]["prompt_tokens"] == 16
    assert too_long.status_code == 400
    error = too_long.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input[1]")


def test_concurrent_requests_on_a_small_balance_never_spend_more_than_it(
    gateway, app, make_funded_key
):
    # 4 tokens at $0.01 each: $0.04 a request; the hold counts 2 framing tokens more.
    balance = Decimal("0.30")
    poor = make_funded_key(balance)
    body = {"model": "embed-dear", "input": "alpha beta gamma delta"}
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda _: post(gateway, poor.key, body), range(24)))

    statuses = sorted({answer.status_code for answer in answers})
    assert statuses == [200, 402], [answer.text for answer in answers if answer.status_code >= 500]
    account, generations, charges, holds = records(app, poor.account_id)
    charged = sum(-charge.amount for charge in charges)
    served = sum(answer.status_code == 200 for answer in answers)
    assert charged <= balance and account.balance >= 0
    assert charged == served * Decimal("0.04") == balance - account.balance
    assert len(generations) == served
    assert all(hold.status != "held" for hold in holds)


def test_an_idempotency_key_runs_the_request_once(gateway, app, funded):
    body = {"model": "dev-embed", "input": ["once"]}
    first = post(gateway, funded.key, body, **{"Idempotency-Key": "embed-once-1"})
    again = post(gateway, funded.key, body, **{"Idempotency-Key": "embed-once-1"})

    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert_charged_at_its_price(
        gateway, app, funded, first.json()["usage"]["prompt_tokens"], "dev-embed"
    )


def test_a_route_that_fails_is_failed_over_and_the_attempts_recorded(client, app, funded):
    answer = client.embeddings.create(model="embed-failover", input="Hello")

    assert len(answer.data[0].embedding) == 256
    (generation,) = records(app, funded.account_id)[1]
    outcomes = [attempt["outcome"] for attempt in generation.upstream_attempts]
    assert outcomes == ["failed_over", "ok"]


def test_openais_answer_in_base64_or_numbers_is_passed_on_at_its_reported_tokens(
    client, gateway, scripted, app, funded
):
    # Asked for base64, OpenAI answers base64; a server that ignores it answers numbers.
    scripted.script("/third", Reply("openai_embeddings_base64"), Reply("openai_embeddings"))

    as_floats = client.embeddings.create(
        model="text-embedding-3-small", input=TWO_TEXTS, dimensions=8, encoding_format="float"
    )
    as_base64 = client.embeddings.create(
        model="text-embedding-3-small", input=TWO_TEXTS, dimensions=8
    )

    recorded = [float32(vector) for vector in openai_vectors("openai_embeddings")]
    assert [item.embedding for item in as_floats.data] == recorded
    assert [item.embedding for item in as_base64.data] == recorded
    assert as_floats.model == "text-embedding-3-small"
    assert as_floats.usage.prompt_tokens == 9
    sent = scripted.exchanges_to("/third")
    assert [exchange.path for exchange in sent] == ["/third/v1/embeddings"] * 2
    assert sent[0].headers["authorization"] == f"Bearer {THIRD_KEY}"
    assert sent[0].json == {
        "model": "text-embedding-3-small",
        "input": TWO_TEXTS,
        "encoding_format": "base64",
        "dimensions": 8,
    }
    generations = records(app, funded.account_id)[1]
    assert [g.prompt_tokens for g in generations] == [9, 9]


def test_vllms_answer_is_charged_at_its_reported_tokens(client, gateway, scripted, app, funded):
    scripted.script("/own", Reply("vllm_embeddings"))

    answer = client.embeddings.create(model="bge-m3", input=TWO_TEXTS, encoding_format="float")

    assert [item.embedding for item in answer.data] == [
        float32(v) for v in openai_vectors("vllm_embeddings")
    ]
    assert scripted.exchanges_to("/own")[0].json["model"] == "BAAI/bge-m3"
    generation, cost = assert_charged_at_its_price(gateway, app, funded, 14, "bge-m3")
    assert answer.model_dump()["usage"]["cost"]["total_cost"] == float(cost)
    assert generation.estimated is False


def test_an_answer_without_usage_is_charged_at_the_counted_inputs(
    client, gateway, scripted, app, funded
):
    scripted.script("/own", Reply("vllm_embeddings_no_usage"))

    answer = client.embeddings.create(model="bge-m3", input=TWO_TEXTS)

    counted = sum(count_text(text, encoding_named("cl100k_base")) for text in TWO_TEXTS)
    assert answer.usage.prompt_tokens == counted
    generation, _ = assert_charged_at_its_price(gateway, app, funded, counted, "bge-m3")
    assert generation.estimated is True


def test_teis_vectors_come_back_in_the_inputs_order(client, gateway, scripted, app, funded):
    scripted.script("/tei", Reply("tei_embeddings"))

    answer = client.embeddings.create(model="bge-large", input=TWO_TEXTS, encoding_format="float")

    assert scripted.exchanges_to("/tei")[0].json["encoding_format"] == "float"
    recorded = sorted(transcript_data("tei_embeddings"), key=lambda item: item["index"])
    assert [item.embedding for item in answer.data] == [
        float32(item["embedding"]) for item in recorded
    ]
    assert_charged_at_its_price(gateway, app, funded, 12, "bge-large")


def test_an_upstream_that_rejects_the_request_is_a_400_and_costs_nothing(
    gateway, scripted, app, funded
):
    scripted.script("/own", Reply("vllm_error_400"))

    answer = post(gateway, funded.key, {"model": "bge-m3", "input": TWO_TEXTS})

    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "upstream_rejected"
    account, generations, _, _ = records(app, funded.account_id)
    assert account.balance == Decimal(5)
    assert [(g.status, g.cost) for g in generations] == [("failed", 0)]


def test_the_ledger_audit_reprices_embeddings_and_metrics_count_them(
    client, gateway, funded, runner
):
    client.embeddings.create(model="dev-embed", input=TWO_TEXTS)

    # This account's books: other tests' rows in the database are not this test's.
    audit = runner.invoke(args=["ledger", "audit", "--full", "--account", str(funded.account_id)])
    scrape = requests.get(
        f"{gateway.url}/metrics",
        headers={"Authorization": f"Bearer {METRICS_TOKEN}"},
        timeout=30,
    ).text

    assert audit.exit_code == 0, audit.output
    assert 'gateway_cost_usd_total{api="embeddings",model="dev-embed"}' in scrape


def transcript_data(name):
    return json.loads(load_transcript(name)[1])["data"]


def openai_vectors(name):
    return [item["embedding"] for item in transcript_data(name)]


def test_base64_is_little_endian_float32(gateway, funded):
    floats = post(
        gateway, funded.key, {"model": "dev-embed", "input": "Hi", "encoding_format": "float"}
    )
    packed = post(
        gateway, funded.key, {"model": "dev-embed", "input": "Hi", "encoding_format": "base64"}
    )

    raw = base64.b64decode(packed.json()["data"][0]["embedding"])
    decoded = array("f")
    decoded.frombytes(raw)
    assert len(raw) == 4 * 256
    assert decoded.tolist() == floats.json()["data"][0]["embedding"]
