"""The Gemini door passing requests through to routes that say ``api = "gemini"``.

Gunicorn serves a catalog whose gemini upstreams the replay server plays, in Google's
wire format; callers use google-genai, and raw HTTP where the test needs the exact bytes.
What reaches the upstream is read from the replay server's record; what was charged, from
the generation record and the ledger.
"""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest
import requests
from google import genai
from google.genai import errors, types

from app.catalog.pricing import cost_of
from app.encoding import loads
from app.money import to_money
from app.providers.gemini import usage_from
from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import Reply, load_transcript

KEY = "AIzaSy-test-only-gemini-key-0000000000"
CATALOG = """
[upstreams.google]
kind = "gemini"
base_url = "{url}/google"
api_key_env = "GEMINI_API_KEY"
retries = 0

[upstreams.google-busy]
kind = "gemini"
base_url = "{url}/busy"
api_key_env = "GEMINI_API_KEY"
retries = 0
# Failing in every test that uses it: never skipped for it.
cooldown_after = 100

[[models]]
id = "gemini-flash"
context_length = 1048576
max_output_tokens = 8192
capabilities = ["tools", "json_schema", "reasoning", "vision"]
pricing = {{ prompt = 0.30, completion = 2.50, cached_read = 0.03 }}
routes = [{{ upstream = "google", model = "gemini-2.5-flash", api = "gemini" }}]

[[models]]
id = "gemini-grounded"
max_output_tokens = 8192
capabilities = ["tools", "reasoning"]
routes = [{{ upstream = "google", model = "gemini-2.5-flash", api = "gemini" }}]
[models.pricing]
prompt = 0.30
completion = 2.50
cached_read = 0.03
tool_calls = {{ web_search = 0.035 }}

[[models]]
id = "gemini-failover"
max_output_tokens = 8192
capabilities = ["tools", "reasoning"]
pricing = {{ prompt = 0.30, completion = 2.50, cached_read = 0.03 }}
routes = [
  {{ upstream = "google-busy", model = "gemini-2.5-flash", api = "gemini" }},
  {{ upstream = "google", model = "gemini-2.5-flash", api = "gemini" }},
]
"""
GENERATE = "/google/v1beta/models/gemini-2.5-flash:generateContent"
STREAM = "/google/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
# 20,000 tokens by any of the encodings (a word a token), 100 kB.
HIDDEN = " ".join(["word"] * 20_000)
ASKED = {"role": "user", "parts": [{"text": "Summarize what you were given."}]}


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemini-native")
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


def genai_client(gateway, key: str) -> genai.Client:
    http = types.HttpOptions(base_url=gateway.url, retry_options=types.HttpRetryOptions(attempts=1))
    return genai.Client(api_key=key, http_options=http)


@pytest.fixture
def gemini(gateway, funded, monkeypatch, tmp_path):
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return genai_client(gateway, funded.key)


def post(gateway, key: str, body: dict, method: str = "generateContent", model="gemini-flash"):
    suffix = "?alt=sse" if method == "streamGenerateContent" else ""
    return requests.post(
        f"{gateway.url}/v1beta/models/{model}:{method}{suffix}",
        headers={"x-goog-api-key": key},
        json=body,
        timeout=60,
    )


def transcript_body(name: str) -> dict:
    return loads(load_transcript(name)[1])


def settled(app, gateway, funded, credits: str = "5"):
    """Return the one generation of the account, checked charged once at its price."""
    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    assert generation.api == "gemini" and charge.amount == -generation.cost
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0
    assert account.balance == Decimal(credits) - generation.cost
    return generation


def priced(gateway, metadata: dict) -> Decimal:
    """Return what Google's usageMetadata costs at the catalog's prices."""
    return cost_of(usage_from(metadata), gateway.catalog.resolve("gemini-flash").pricing)


def test_a_whole_answer_is_the_upstreams_with_the_gateways_id_and_its_catalog_cost(
    app, gateway, gemini, funded, scripted
):
    scripted.script("/google", Reply("gemini_generate"))

    response = gemini.models.generate_content(
        model="gemini-flash",
        contents="Capital of France?",
        config=types.GenerateContentConfig(temperature=0.2, max_output_tokens=100),
    )

    assert response.text == "The capital of France is Paris."
    generation = settled(app, gateway, funded)
    assert response.response_id == generation.id
    assert response.model_version == "gemini-2.5-flash"
    # fresh 52 at prompt, 2048 cache reads at cached_read, 8 + 180 thoughts at completion.
    metadata = transcript_body("gemini_generate")["usageMetadata"]
    assert (generation.prompt_tokens, generation.cached_tokens) == (2100, 2048)
    assert (generation.completion_tokens, generation.reasoning_tokens) == (188, 180)
    expected = (52 * Decimal("0.30") + 2048 * Decimal("0.03") + 188 * Decimal("2.50")) / 10**6
    assert generation.cost == priced(gateway, metadata) == to_money(expected)
    (exchange,) = scripted.exchanges
    assert exchange.path == GENERATE and exchange.headers["x-goog-api-key"] == KEY
    sent = exchange.json
    assert sent["contents"] == [{"parts": [{"text": "Capital of France?"}], "role": "user"}]
    assert sent["generationConfig"] == {"temperature": 0.2, "maxOutputTokens": 100}


def test_the_answer_is_byte_identical_but_its_id_and_cost(app, gateway, funded, scripted):
    scripted.script("/google", Reply("gemini_generate_tool_call"), Reply("gemini_generate"))

    response = post(gateway, funded.key, {"contents": [ASKED]})

    assert response.status_code == 200, response.text
    answer = response.json()
    upstream = transcript_body("gemini_generate_tool_call")
    generation = settled(app, gateway, funded)
    cost = answer["usageMetadata"].pop("cost")
    assert (
        Decimal(str(cost["totalCost"]))
        == generation.cost
        == priced(gateway, upstream["usageMetadata"])
    )
    assert answer == {**upstream, "responseId": generation.id}
    # The signature's bytes as Google wrote them (not strict base64: passed on, not read).
    signature = upstream["candidates"][0]["content"]["parts"][1]["thoughtSignature"]
    assert b'"thoughtSignature":"%s"' % signature.encode() in response.content

    # The model's turn sent back as it came: the upstream reads the signature as it wrote it.
    turn = answer["candidates"][0]["content"]
    results = [{"functionResponse": {"name": "get_weather", "response": {"t": "18 C"}}}] * 2
    second = {"contents": [ASKED, turn, {"role": "user", "parts": results}]}
    assert post(gateway, funded.key, second).status_code == 200
    sent_back = scripted.exchanges[1].body
    assert b'"thoughtSignature":"%s"' % signature.encode() in sent_back.replace(b" ", b"")


def test_a_thought_signature_round_trips_byte_identical_across_two_turns(
    gateway, gemini, funded, scripted
):
    scripted.script("/google", Reply("gemini_generate_signed_call"), Reply("gemini_generate"))
    weather = types.FunctionDeclaration(
        name="get_weather",
        description="Current weather in a city",
        parameters=types.Schema(
            type=types.Type.OBJECT, properties={"city": types.Schema(type=types.Type.STRING)}
        ),
    )
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[weather])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    asked = types.Content(role="user", parts=[types.Part(text="Weather in Paris and Rome?")])

    first = gemini.models.generate_content(model="gemini-flash", contents=[asked], config=config)
    turn = first.candidates[0].content
    answers = [
        types.Part(
            function_response=types.FunctionResponse(name="get_weather", response={"t": "18 C"})
        )
        for _ in turn.parts[1:]
    ]
    gemini.models.generate_content(
        model="gemini-flash",
        contents=[asked, turn, types.Content(role="user", parts=answers)],
        config=config,
    )

    parts = transcript_body("gemini_generate_signed_call")["candidates"][0]["content"]["parts"]
    signature = parts[1]["thoughtSignature"]
    assert turn.parts[1].thought_signature == base64.b64decode(signature)
    first_sent, second_sent = (exchange.json for exchange in scripted.exchanges)
    # google-genai sends bytes back in URL-safe base64: the same bytes.
    sent_back = second_sent["contents"][1]["parts"][1]["thoughtSignature"]
    assert base64.urlsafe_b64decode(sent_back) == base64.b64decode(signature)
    assert second_sent["contents"][1]["parts"][1]["functionCall"]["args"] == {"city": "Paris"}
    assert second_sent["tools"] == first_sent["tools"]


def test_a_stream_is_passed_through_with_the_gateways_id_and_its_cost_at_the_end(
    app, gateway, gemini, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream"))

    chunks = list(
        gemini.models.generate_content_stream(model="gemini-flash", contents="9.11 or 9.8?")
    )

    generation = settled(app, gateway, funded)
    assert {chunk.response_id for chunk in chunks} == {generation.id}
    texts = [part.text for chunk in chunks for part in chunk.candidates[0].content.parts]
    assert texts == ["**Comparing decimals**\n\n9.80 against 9.11.", "9.8 is", " greater than",
                     " 9.11."]  # fmt: skip
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    (exchange,) = scripted.exchanges
    assert exchange.path == STREAM
    events = [
        json.loads(event[6:])
        for event in load_transcript("gemini_stream")[1].decode().split("\r\n\r\n")
        if event.strip()
    ]  # noqa: E501
    assert generation.cost == priced(gateway, events[-1]["usageMetadata"])
    assert (generation.completion_tokens, generation.cached_tokens) == (249, 2048)


def test_a_streams_events_are_the_upstreams_and_the_last_carries_the_cost(
    app, gateway, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream"))

    response = post(gateway, funded.key, {"contents": [ASKED]}, "streamGenerateContent")

    assert response.status_code == 200, response.text
    frames = response.text.split("\n\n")
    assert frames[-1] == ""
    events = [json.loads(frame.removeprefix("data: ")) for frame in frames[:-1]]
    upstream = [
        json.loads(event.removeprefix("data: "))
        for event in load_transcript("gemini_stream")[1].decode().split("\r\n\r\n")
        if event.strip()
    ]
    generation = settled(app, gateway, funded)
    cost = events[-1]["usageMetadata"].pop("cost")
    assert Decimal(str(cost["totalCost"])) == generation.cost
    assert events == [{**event, "responseId": generation.id} for event in upstream]


def test_a_stream_cut_before_its_end_is_billed_for_what_it_delivered(
    app, gateway, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream_error"))

    response = post(gateway, funded.key, {"contents": [ASKED]}, "streamGenerateContent")

    frames = [json.loads(frame[6:]) for frame in response.text.split("\n\n") if frame]
    assert frames[-1]["error"]["status"] == "UNAVAILABLE"
    texts = [frame["candidates"][0]["content"]["parts"][0]["text"] for frame in frames[:-1]]
    assert texts == ["Once upon", " a time"]
    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    assert (generation.status, generation.estimated) == ("failed", True)
    # Google counted the prompt on its first event: that count, not the hold's estimate.
    assert generation.prompt_tokens == 10
    route = gateway.catalog.resolve("gemini-flash").routes[0]
    counted = sum(route.adapter.count_text_tokens(text, route.target) for text in texts)
    assert generation.completion_tokens == counted
    assert charge.amount == -generation.cost and generation.cost > 0 and account.reserved == 0


def test_an_answer_without_usage_is_settled_at_once_never_for_nothing(
    app, gateway, funded, scripted
):
    scripted.script("/google", Reply("gemini_generate_no_usage"))

    response = post(gateway, funded.key, {"contents": [ASKED]})

    assert response.status_code == 200, response.text
    answer = response.json()
    generation = settled(app, gateway, funded)
    assert generation.estimated and generation.prompt_tokens > 0
    assert generation.completion_tokens > 0
    assert Decimal(str(answer["usageMetadata"]["cost"]["totalCost"])) == generation.cost > 0


def test_a_part_that_cannot_be_counted_is_refused_in_googles_envelope_before_sending(
    app, gateway, funded, scripted
):
    blob = {"mimeType": "application/x-made-up", "data": base64.b64encode(b"\0" * 64).decode()}
    body = {"contents": [{"role": "user", "parts": [{"inlineData": blob}, {"text": "What?"}]}]}

    response = post(gateway, funded.key, body)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT")
    assert "application/x-made-up" in error["message"]
    assert scripted.exchanges == []
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert (generations, charges, account.balance) == ([], [], Decimal("5"))


# The same text, where a Gemini body can carry it: a text part, and parts the gateway's
# translation never reads.
CARRYING_IT = {
    "a text part": [{"role": "user", "parts": [{"text": HIDDEN}]}, ASKED],
    "a part of a kind added later": [
        {"role": "user", "parts": [{"notes2027": {"notes": HIDDEN}}]},
        ASKED,
    ],
    "code a tool ran": [
        {
            "role": "model",
            "parts": [
                {"executableCode": {"language": "PYTHON", "code": "print(notes)"}},
                {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": HIDDEN}},
            ],
        },
        ASKED,
    ],
    "beside an image": [
        {
            "role": "user",
            "parts": [
                {
                    "inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="},
                    "videoMetadata": {"notes": HIDDEN},
                }
            ],
        },
        ASKED,
    ],
    # Arguments are JSON the model reads: what looks like inline data there is text.
    "a function call's arguments shaped as inline data": [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {
                        "name": "notes",
                        "args": {"inlineData": {"mimeType": "image/png", "data": HIDDEN}},
                    }
                }
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "notes", "response": {"ok": True}}}],
        },
        ASKED,
    ],
}


@pytest.mark.parametrize("carrier", CARRYING_IT)
def test_text_wherever_it_is_counted_by_the_hold_402_on_a_small_balance(
    app, gateway, make_funded_key, scripted, carrier
):
    # 20,000 tokens cost $0.006 at $0.30 per million: $0.005 cannot hold them, where it
    # holds the prompt asked (about 10 tokens) and 100 tokens of output many times over.
    funded = make_funded_key(Decimal("0.005"))
    body = {"contents": CARRYING_IT[carrier], "generationConfig": {"maxOutputTokens": 100}}

    response = post(gateway, funded.key, body)

    assert response.status_code == 402, response.text
    assert response.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert scripted.exchanges == []
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert (generations, charges, account.balance) == ([], [], Decimal("0.005"))


def test_count_tokens_counts_what_a_hold_counts(gateway, funded):
    counts = {
        carrier: post(gateway, funded.key, {"contents": contents}, "countTokens")
        for carrier, contents in CARRYING_IT.items()
    }

    assert all(response.status_code == 200 for response in counts.values())
    plain = counts["a text part"].json()["totalTokens"]
    assert plain >= 20_000
    for carrier, counted in counts.items():
        assert counted.json()["totalTokens"] >= plain - 50, carrier


def test_requests_at_once_never_send_more_than_the_balance_pays(
    app, gateway, make_funded_key, scripted
):
    scripted.script("/google", *[Reply("gemini_generate_long_prompt")] * 16)
    funded = make_funded_key(Decimal("0.03"))
    body = {"contents": CARRYING_IT["code a tool ran"]}

    with ThreadPoolExecutor(max_workers=16) as pool:
        outcomes = list(pool.map(lambda _: post(gateway, funded.key, body), range(16)))

    answered = [outcome for outcome in outcomes if outcome.status_code == 200]
    refused = [outcome for outcome in outcomes if outcome.status_code != 200]
    assert answered and {outcome.status_code for outcome in refused} == {402}
    assert len(scripted.exchanges) == len(answered)
    sent_worth = len(answered) * priced(
        gateway, transcript_body("gemini_generate_long_prompt")["usageMetadata"]
    )
    assert sent_worth <= Decimal("0.03")
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert account.balance == Decimal("0.03") - sent_worth and account.reserved == 0
    assert all(generation.shortfall == 0 for generation in generations)
    # The replies the refused requests never asked for.
    scripted.reset()


@pytest.mark.parametrize("failure", ["gemini_error_429", "gemini_error_500", "gemini_error_503"])
def test_a_busy_route_fails_over_to_the_next_native_route(
    app, gateway, gemini, funded, scripted, failure
):
    scripted.script("/busy", Reply(failure))
    scripted.script("/google", Reply("gemini_generate"))

    response = gemini.models.generate_content(model="gemini-failover", contents="Capital?")

    assert response.text == "The capital of France is Paris."
    busy, google = scripted.exchanges
    assert busy.path.startswith("/busy/v1beta/models/gemini-2.5-flash:generateContent")
    assert google.path == GENERATE and busy.body == google.body
    generation = settled(app, gateway, funded)
    assert response.response_id == generation.id


def test_every_route_failing_is_googles_error_charged_nothing(app, gemini, funded, scripted):
    scripted.script("/busy", Reply("gemini_error_429"))
    scripted.script("/google", Reply("gemini_error_503"))

    with pytest.raises(errors.APIError) as failed:
        gemini.models.generate_content(model="gemini-failover", contents="Capital?")

    assert failed.value.code in (429, 503)
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert charges == [] and account.balance == Decimal("5") and account.reserved == 0


def test_a_repeated_idempotency_key_is_answered_and_charged_once(app, gateway, funded, scripted):
    scripted.script("/google", Reply("gemini_generate"))
    headers = {"x-goog-api-key": funded.key, "Idempotency-Key": "gemini-native-once"}
    url = f"{gateway.url}/v1beta/models/gemini-flash:generateContent"

    first = requests.post(url, headers=headers, json={"contents": [ASKED]}, timeout=60)
    again = requests.post(url, headers=headers, json={"contents": [ASKED]}, timeout=60)

    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert len(scripted.exchanges) == 1
    generation = settled(app, gateway, funded)
    assert first.json()["responseId"] == generation.id


def test_an_output_limit_past_the_models_is_capped_and_set_when_absent(gateway, funded, scripted):
    scripted.script("/google", Reply("gemini_generate"), Reply("gemini_generate"))

    asked_too_much = {"contents": [ASKED], "generation_config": {"max_output_tokens": 100_000}}
    assert post(gateway, funded.key, asked_too_much).status_code == 200
    assert post(gateway, funded.key, {"contents": [ASKED]}).status_code == 200

    capped, unset = (exchange.json for exchange in scripted.exchanges)
    assert capped["generation_config"] == {"maxOutputTokens": 8192}
    assert unset["generationConfig"] == {"maxOutputTokens": 8192}


def test_google_search_on_a_model_that_does_not_price_it_is_refused_before_sending(
    app, gateway, funded, scripted
):
    body = {"contents": [ASKED], "tools": [{"googleSearch": {}}]}

    response = post(gateway, funded.key, body)

    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and "web_search" in error["message"]
    assert scripted.exchanges == []
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert (generations, charges, account.balance) == ([], [], Decimal("5"))


def test_google_search_is_billed_per_grounding_query_and_tool_use_tokens_as_input(
    app, gateway, gemini, funded, scripted
):
    scripted.script("/google", Reply("gemini_generate_grounded"))

    response = gemini.models.generate_content(
        model="gemini-grounded",
        contents="Who won Euro 2024?",
        config=types.GenerateContentConfig(tools=[types.Tool(google_search=types.GoogleSearch())]),
    )

    assert response.text.startswith("Spain won Euro 2024")
    grounding = response.candidates[0].grounding_metadata
    assert grounding.web_search_queries == ["who won euro 2024", "euro 2024 final score"]
    generation = settled(app, gateway, funded)
    # 12 prompt + 180 from the search's results at prompt, 17 + 192 thoughts at completion,
    # two queries at $0.035.
    assert (generation.prompt_tokens, generation.completion_tokens) == (192, 209)
    tokens = (192 * Decimal("0.30") + 209 * Decimal("2.50")) / 10**6
    assert generation.cost == to_money(tokens + 2 * Decimal("0.035"))
    (exchange,) = scripted.exchanges
    assert exchange.json["tools"] == [{"googleSearch": {}}]


def test_a_streams_grounding_after_its_usage_is_billed_all_the_same(
    app, gateway, gemini, funded, scripted
):
    scripted.script("/google", Reply("gemini_stream_grounded"))

    chunks = list(
        gemini.models.generate_content_stream(
            model="gemini-grounded",
            contents="Who won Euro 2024?",
            config=types.GenerateContentConfig(
                tools=[types.Tool(google_search=types.GoogleSearch())]
            ),
        )
    )

    assert chunks[-1].candidates[0].grounding_metadata.web_search_queries == [
        "who won euro 2024",
        "euro 2024 final score",
    ]
    generation = settled(app, gateway, funded)
    assert {chunk.response_id for chunk in chunks} == {generation.id}
    assert (generation.prompt_tokens, generation.completion_tokens) == (192, 209)
    tokens = (192 * Decimal("0.30") + 209 * Decimal("2.50")) / 10**6
    assert generation.cost == to_money(tokens + 2 * Decimal("0.035"))
