"""The Gemini door over raw HTTP: its responses and events, Google's envelope, money, bad input.

Clients' own tests (tests/clients) show google-genai and Gemini CLI work; these show what
they rely on, on the wire, including what no SDK would send.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import running_server
from tests.contract.conftest import billing_records

HELLO = [{"role": "user", "parts": [{"text": "Hello there"}]}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "OBJECT",
        "properties": {"city": {"type": "STRING"}, "unit": {"type": "STRING", "nullable": True}},
        "required": ["city"],
        "propertyOrdering": ["city", "unit"],
    },
}


def post(server, key, body, path="/v1beta/models/dev-chat:generateContent", **kwargs):
    headers = {"x-goog-api-key": key, **kwargs.pop("headers", {})}
    return requests.post(f"{server.url}{path}", headers=headers, json=body, timeout=60, **kwargs)


def events_of(response: requests.Response) -> list[dict]:
    """Parse a stream of ``data:`` events, each one whole JSON object."""
    frames = response.text.split("\n\n")
    assert frames[-1] == ""
    events = []
    for frame in frames[:-1]:
        assert frame.startswith("data: ") and "\n" not in frame, frame
        events.append(json.loads(frame[len("data: ") :]))
    return events


def envelope(response: requests.Response, code: int, status: str) -> str:
    assert response.status_code == code, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert body == {"error": {"code": code, "message": body["error"]["message"], "status": status}}
    return body["error"]["message"]


def charged(app, funded_key) -> tuple[Decimal, list]:
    """Return what the account was charged, and its generation records; nothing left held."""
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert account.reserved == 0 and all(hold.status == "settled" for hold in holds)
    spent = -sum(charge.amount for charge in charges)
    assert account.balance == Decimal("10") - spent
    return spent, generations


def test_generate_content_answers_in_googles_shape_and_charges_the_cost_it_reports(
    app, live_server, funded_key
):
    body = {
        "contents": HELLO,
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "generationConfig": {"maxOutputTokens": 64, "temperature": 0.2},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
    }
    response = post(live_server, funded_key.key, body)

    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"candidates", "usageMetadata", "modelVersion", "responseId"}
    (candidate,) = answer["candidates"]
    assert candidate["content"]["role"] == "model"
    assert candidate["content"]["parts"][0]["text"].startswith("Hello there")
    assert candidate["finishReason"] == "STOP"
    usage = answer["usageMetadata"]
    assert usage["totalTokenCount"] == usage["promptTokenCount"] + usage["candidatesTokenCount"]
    assert answer["modelVersion"] == "dev-chat"
    spent, (generation,) = charged(app, funded_key)
    assert Decimal(str(usage["cost"]["totalCost"])) == spent > 0
    assert generation.id == answer["responseId"]
    assert (generation.api, generation.streamed) == ("gemini", False)
    assert generation.prompt_tokens == usage["promptTokenCount"]
    assert generation.completion_tokens == usage["candidatesTokenCount"]


def test_snake_case_fields_are_read_as_their_camel_case_names(app, live_server, funded_key):
    body = {
        "contents": HELLO,
        "system_instruction": {"parts": [{"text": "Be brief."}]},
        "generation_config": {"max_output_tokens": 3, "stop_sequences": ["zzz"]},
    }
    response = post(live_server, funded_key.key, body)

    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert answer["usageMetadata"]["candidatesTokenCount"] == 3


def test_a_stream_is_one_response_per_event_ending_with_the_finish_usage_and_cost(
    app, live_server, funded_key
):
    response = post(
        live_server, funded_key.key, {"contents": HELLO},
        "/v1beta/models/dev-chat:streamGenerateContent?alt=sse",
    )  # fmt: skip

    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = events_of(response)
    assert len(events) > 2
    ids = {event["responseId"] for event in events}
    text = "".join(
        part.get("text", "")
        for event in events
        for part in event["candidates"][0]["content"]["parts"]
    )
    assert text.startswith("Hello there")
    assert all("usageMetadata" not in event for event in events[:-1])
    assert all("finishReason" not in event["candidates"][0] for event in events[:-1])
    last = events[-1]
    assert last["candidates"][0]["finishReason"] == "STOP"
    spent, (generation,) = charged(app, funded_key)
    assert Decimal(str(last["usageMetadata"]["cost"]["totalCost"])) == spent > 0
    assert ids == {generation.id}
    assert (generation.api, generation.streamed) == ("gemini", True)


def test_a_function_call_round_trip_with_a_google_schema(app, live_server, funded_key):
    tools = [{"functionDeclarations": [WEATHER]}, {"googleSearch": {}}]
    ask = [{"role": "user", "parts": [{"text": "Call get_weather for Paris"}]}]
    response = post(live_server, funded_key.key, {"contents": ask, "tools": tools})

    assert response.status_code == 200, response.text
    parts = response.json()["candidates"][0]["content"]["parts"]
    calls = [part["functionCall"] for part in parts if "functionCall" in part]
    assert [call["name"] for call in calls] == ["get_weather"]
    assert isinstance(calls[0]["args"]["city"], str)
    answered = ask + [
        {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {}}}]},
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 21}}}],
        },
    ]
    response = post(live_server, funded_key.key, {"contents": answered, "tools": tools})

    assert response.status_code == 200, response.text
    parts = response.json()["candidates"][0]["content"]["parts"]
    assert [list(part) for part in parts] == [["text"]]


def test_thoughts_are_shown_only_when_asked_for(app, live_server, funded_key):
    thinking = {"thinkingConfig": {"thinkingBudget": 20000, "includeThoughts": True}}
    shown = post(live_server, funded_key.key, {"contents": HELLO, "generationConfig": thinking})
    thinking["thinkingConfig"]["includeThoughts"] = False
    hidden = post(live_server, funded_key.key, {"contents": HELLO, "generationConfig": thinking})

    assert shown.status_code == hidden.status_code == 200, shown.text
    parts = shown.json()["candidates"][0]["content"]["parts"]
    assert parts[0]["thought"] is True and parts[0]["text"]
    assert shown.json()["usageMetadata"]["thoughtsTokenCount"] > 0
    assert not any(
        part.get("thought") for part in hidden.json()["candidates"][0]["content"]["parts"]
    )
    assert hidden.json()["usageMetadata"]["thoughtsTokenCount"] > 0


@pytest.mark.parametrize(
    "headers, path",
    [
        ({}, "/v1beta/models/dev-chat:generateContent?key={key}"),
        ({"Authorization": "Bearer {key}"}, "/v1beta/models/models/dev-chat:generateContent"),
        ({"x-goog-api-key": "{key}"}, "/v1/models/dev-chat:generateContent"),
    ],
)
def test_keys_come_where_googles_clients_send_them(live_server, funded_key, headers, path):
    headers = {name: value.format(key=funded_key.key) for name, value in headers.items()}
    response = requests.post(
        live_server.url + path.format(key=funded_key.key),
        headers=headers,
        json={"contents": HELLO},
        timeout=60,
    )

    assert response.status_code == 200, response.text
    assert response.json()["modelVersion"] == "dev-chat"


def test_errors_come_in_googles_envelope(live_server, funded_key, make_funded_key):
    path = "/v1beta/models/dev-chat:generateContent"
    message = envelope(post(live_server, "sk-wrong", {"contents": HELLO}), 401, "UNAUTHENTICATED")
    assert "x-goog-api-key" in message
    message = envelope(
        post(
            live_server, funded_key.key, {"contents": HELLO}, "/v1beta/models/nope:generateContent"
        ),
        404,
        "NOT_FOUND",
    )
    assert "nope" in message
    message = envelope(
        post(live_server, funded_key.key, {"contents": [{"role": "user", "parts": "hi"}]}, path),
        400,
        "INVALID_ARGUMENT",
    )
    assert message.startswith("contents[0].parts ")
    envelope(post(live_server, funded_key.key, {"contents": []}, path), 400, "INVALID_ARGUMENT")
    envelope(post(live_server, funded_key.key, [], path), 400, "INVALID_ARGUMENT")
    envelope(
        post(live_server, funded_key.key, {"contents": HELLO}, "/v1beta/models/dev-chat:explode"),
        400,
        "INVALID_ARGUMENT",
    )
    pdf = {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}}
    message = envelope(
        post(live_server, funded_key.key, {"contents": [{"parts": [pdf]}]}, path),
        400,
        "INVALID_ARGUMENT",
    )
    assert message.startswith("contents[0].parts[0].inlineData.mimeType")
    envelope(requests.get(f"{live_server.url}/v1beta/nowhere", timeout=10), 404, "NOT_FOUND")


def test_no_credit_is_402_resource_exhausted_and_nothing_is_charged(
    app, live_server, make_funded_key
):
    poor = make_funded_key(Decimal("0"))
    message = envelope(post(live_server, poor.key, {"contents": HELLO}), 402, "RESOURCE_EXHAUSTED")

    assert message.startswith("Insufficient credits")
    assert "generationConfig.maxOutputTokens" in message or "Add credits" in message


def test_count_tokens_is_free_and_counts_what_a_hold_would(app, live_server, funded_key):
    path = "/v1beta/models/dev-chat:countTokens"
    short = post(live_server, funded_key.key, {"contents": HELLO}, path)
    longer = post(
        live_server,
        funded_key.key,
        {
            "generateContentRequest": {
                "contents": HELLO,
                "tools": [{"functionDeclarations": [WEATHER]}],
            }
        },
        path,
    )

    assert short.status_code == longer.status_code == 200, short.text
    assert 0 < short.json()["totalTokens"] < longer.json()["totalTokens"]
    _, _, charges, holds = billing_records(app, funded_key.account_id)
    assert charges == [] and holds == []


def test_models_are_listed_and_named_as_google_names_them(live_server, funded_key):
    headers = {"x-goog-api-key": funded_key.key}
    listed = requests.get(f"{live_server.url}/v1beta/models", headers=headers, timeout=10)
    one = requests.get(f"{live_server.url}/v1beta/models/dev-chat", headers=headers, timeout=10)
    prefixed = requests.get(
        f"{live_server.url}/v1beta/models/models/dev-chat", headers=headers, timeout=10
    )
    paged = requests.get(f"{live_server.url}/v1beta/models?pageSize=1", headers=headers, timeout=10)
    missing = requests.get(f"{live_server.url}/v1beta/models/nope", headers=headers, timeout=10)

    assert listed.status_code == 200, listed.text
    names = [model["name"] for model in listed.json()["models"]]
    assert "models/dev-chat" in names and "models/dev-hidden" not in names
    assert one.json() == prefixed.json()
    assert one.json()["inputTokenLimit"] == 32768 and one.json()["outputTokenLimit"] == 4096
    assert "generateContent" in one.json()["supportedGenerationMethods"]
    assert len(paged.json()["models"]) == 1 and paged.json()["nextPageToken"] == "1"
    envelope(missing, 404, "NOT_FOUND")


def test_an_idempotency_key_replays_the_answer_and_charges_once(app, live_server, funded_key):
    headers = {"Idempotency-Key": "gemini-retry-1"}
    first = post(live_server, funded_key.key, {"contents": HELLO}, headers=headers)
    again = post(live_server, funded_key.key, {"contents": HELLO}, headers=headers)

    assert first.status_code == again.status_code == 200, first.text
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    spent, (generation,) = charged(app, funded_key)
    assert generation.id == first.json()["responseId"]
    assert Decimal(str(first.json()["usageMetadata"]["cost"]["totalCost"])) == spent


def test_a_stream_broken_by_its_upstream_ends_with_googles_error_and_pays_what_came(
    app, live_server, funded_key
):
    ask = [{"role": "user", "parts": [{"text": "one two three four five six seven"}]}]
    response = post(
        live_server, funded_key.key, {"contents": ask},
        "/v1beta/models/dev-dying:streamGenerateContent?alt=sse",
    )  # fmt: skip

    assert response.status_code == 200
    *delivered, last = events_of(response)
    texts = [
        part["text"] for event in delivered for part in event["candidates"][0]["content"]["parts"]
    ]
    assert len(texts) == 5
    assert set(last) == {"error"} and last["error"]["code"] == 502
    assert last["error"]["status"] == "UNAVAILABLE"
    spent, (generation,) = charged(app, funded_key)
    assert generation.status == "failed" and generation.estimated
    assert generation.completion_tokens == 5 and spent == generation.cost > 0


def test_the_v1_model_list_answers_googles_clients_in_googles_shape(live_server, funded_key):
    google = {"x-goog-api-key": funded_key.key}
    openai = {"Authorization": f"Bearer {funded_key.key}"}
    listed = requests.get(f"{live_server.url}/v1/models", headers=google, timeout=10)
    one = requests.get(f"{live_server.url}/v1/models/models/dev-chat", headers=google, timeout=10)
    theirs = requests.get(f"{live_server.url}/v1/models", headers=openai, timeout=10)
    missing = requests.get(f"{live_server.url}/v1/models/nope", headers=google, timeout=10)
    not_google = requests.get(f"{live_server.url}/v1/models/nope", headers=openai, timeout=10)

    assert "models/dev-chat" in [model["name"] for model in listed.json()["models"]]
    assert one.json()["name"] == "models/dev-chat"
    assert theirs.json()["object"] == "list"
    envelope(missing, 404, "NOT_FOUND")
    assert set(not_google.json()["error"]) == {"message", "type", "code", "param"}


def test_metrics_and_the_access_line_name_the_gemini_api(app, database_url, tmp_path, funded_key):
    token = "metrics-token-of-the-gemini-test"
    path = "/v1beta/models/dev-chat-mini:generateContent"
    with running_server(
        database_url, tmp_path, METRICS_TOKEN=token, RATE_LIMIT="2 per 5 second"
    ) as server:
        answered = [post(server, funded_key.key, {"contents": HELLO}, path) for _ in range(3)]
        time.sleep(0.3)  # the access line and metrics are written as the response closes
        scraped = requests.get(
            f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).text

    assert [response.status_code for response in answered[:2]] == [200, 200]
    envelope(answered[2], 429, "RESOURCE_EXHAUSTED")
    assert int(answered[2].headers["Retry-After"]) >= 1
    generations = billing_records(app, funded_key.account_id)[1]
    costs = {
        sample.labels["api"]: sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name == "gateway_cost_usd_total" and sample.labels["model"] == "dev-chat-mini"
    }
    assert costs == {"gemini": pytest.approx(float(sum(g.cost for g in generations)))}
    log = next(tmp_path.glob("gunicorn-*.log")).read_text()
    assert f"api=gemini upstream=builtin generation_id={generations[0].id}" in log
    assert funded_key.key not in log
