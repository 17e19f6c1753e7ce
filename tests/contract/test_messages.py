"""The Messages door over raw HTTP: its events byte by byte, its envelope, money, hostile input.

Clients' own tests (tests/clients) show the SDKs and Claude Code work; these show what
they rely on, on the wire, including what no SDK would send.
"""

from __future__ import annotations

import json
import re
import time
from decimal import Decimal

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import running_server
from tests.contract.conftest import billing_records

HELLO = [{"role": "user", "content": "Hello there"}]
TOOLS = [
    {
        "name": name,
        "description": f"The {name} tool",
        "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    }
    for name in ("Read", "Write", "Bash")
] + [
    {
        "name": "DeferredTool",
        "description": "Deferred",
        "input_schema": {"type": "object"},
        "defer_loading": True,
    }
]
# What Claude Code 2.1.332 sends, in its order and shapes (captured in front of a local server).
CLAUDE_CODE_BODY = {
    "model": "dev-chat",
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Greet the gateway"}]},
        {
            "role": "system",
            "content": [
                {
                    "type": "text",
                    "text": "# Environment\nYou can use Read, Write and Bash.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ],
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8;"},
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral"}},
    ],
    "tools": TOOLS,
    "metadata": {"user_id": json.dumps({"device_id": "d" * 64, "session_id": "s"})},
    "max_tokens": 32000,
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "stream": True,
}
CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
    "context-management-2025-06-27,effort-2025-11-24",
    "x-app": "cli",
    "X-Claude-Code-Session-Id": "ed4e7f45-0000-4000-8000-000000000000",
    "Accept": "application/json",
}
TOO_DEEP = json.loads("[" * 70 + "]" * 70)
EVENT_ORDER = re.compile(
    r"message_start (content_block_start (ping )?(content_block_delta )*content_block_stop )*"
    r"message_delta message_stop "
)


def post(server, key, body, path="/v1/messages", **kwargs) -> requests.Response:
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01", **kwargs.pop("headers", {})}
    return requests.post(f"{server.url}{path}", headers=headers, json=body, timeout=60, **kwargs)


def events_of(response: requests.Response) -> list[dict]:
    """Parse an event stream; every frame's ``event:`` line must name its data's type."""
    frames = response.text.split("\n\n")
    assert frames[-1] == ""
    events = []
    for frame in frames[:-1]:
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), frame
        event = json.loads(data[len("data: ") :])
        assert event["type"] == name[len("event: ") :]
        events.append(event)
    return events


def envelope(response: requests.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert body == {"type": "error", "error": {"type": kind, "message": body["error"]["message"]}}
    return body["error"]["message"]


def test_claude_codes_request_is_streamed_as_anthropics_events_and_billed_once(
    app, live_server, funded_key
):
    response = post(
        live_server, funded_key.key, CLAUDE_CODE_BODY, "/v1/messages?beta=true",
        headers=CLAUDE_CODE_HEADERS,
    )  # fmt: skip

    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/event-stream")
    assert response.headers["request-id"] == response.headers["X-Request-Id"]
    events = events_of(response)
    assert EVENT_ORDER.fullmatch("".join(event["type"] + " " for event in events))
    starts = [event for event in events if event["type"] == "content_block_start"]
    assert [event["index"] for event in starts] == [0, 1]
    assert [event["content_block"]["type"] for event in starts] == ["thinking", "text"]
    assert events[2]["type"] == "ping"
    deltas = [event["delta"] for event in events if event["type"] == "content_block_delta"]
    assert [delta["type"] for delta in deltas if delta["type"] != "text_delta"] == [
        "signature_delta"  # display omitted: the thinking's text is not sent
    ]
    text = "".join(delta["text"] for delta in deltas if delta["type"] == "text_delta")
    assert text.startswith("Greet the gateway ")
    message = events[0]["message"]
    assert message["id"].startswith("msg_") and message["content"] == []
    assert (message["model"], message["stop_reason"]) == ("dev-chat", None)
    end = events[-2]
    assert end["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    account, (generation,), (charge,), _ = billing_records(app, funded_key.account_id)
    assert (generation.id, generation.api, generation.streamed) == (message["id"], "messages", True)
    assert Decimal(str(end["usage"]["cost"]["total_cost"])) == generation.cost == -charge.amount
    assert end["usage"]["input_tokens"] == generation.prompt_tokens
    assert end["usage"]["output_tokens"] == generation.completion_tokens
    assert end["usage"]["output_tokens_details"] == {"thinking_tokens": generation.reasoning_tokens}
    assert generation.reasoning_tokens == 128  # effort high
    assert account.balance == Decimal(10) - generation.cost


def test_claude_codes_fallback_without_streaming_is_a_whole_message(app, live_server, funded_key):
    body = {**CLAUDE_CODE_BODY, "stream": False}

    response = post(
        live_server, funded_key.key, body, "/v1/messages?beta=true", headers=CLAUDE_CODE_HEADERS
    )

    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    message = response.json()
    assert [block["type"] for block in message["content"]] == ["thinking", "text"]
    assert message["content"][0]["thinking"] == "" and message["content"][0]["signature"]
    (generation,) = billing_records(app, funded_key.account_id)[1]
    assert Decimal(str(message["usage"]["cost"]["total_cost"])) == generation.cost
    assert not generation.streamed


def test_no_anthropic_headers_are_needed(live_server, funded_key):
    response = requests.post(
        f"{live_server.url}/v1/messages",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        json={"model": "dev-chat-mini", "max_tokens": 20, "messages": HELLO},
        timeout=30,
    )

    assert response.status_code == 200
    assert response.json()["content"][0]["text"].startswith("Hello there")


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status", "kind"),
    [
        ("GET", "/v1/messages", {}, 405, "invalid_request_error"),
        ("POST", "/v1/messages/batches", {"json": {}}, 404, "not_found_error"),
        ("POST", "/v1/messages", {"data": b"{not json"}, 400, "invalid_request_error"),
        (
            "POST",
            "/v1/messages",
            {"data": b"hello", "headers": {"Content-Type": "text/plain"}},
            415,
            "invalid_request_error",
        ),
        ("POST", "/v1/messages", {"json": ["a list"]}, 400, "invalid_request_error"),
        (
            "POST",
            "/v1/messages",
            {"json": {"model": "dev-chat", "max_tokens": 5, "messages": TOO_DEEP}},
            400,
            "invalid_request_error",
        ),
        (
            "POST",
            "/v1/messages",
            {"json": {"model": "claude-sonnet-4-6", "max_tokens": 5, "messages": HELLO}},
            404,
            "not_found_error",
        ),
        (
            "POST",
            "/v1/messages/count_tokens?beta=true",
            {"json": {"model": "no-such-model", "messages": HELLO}},
            404,
            "not_found_error",
        ),
        ("GET", "/v1/models/no-such-model", {}, 404, "not_found_error"),
        ("GET", "/v1/models?limit=0", {}, 400, "invalid_request_error"),
    ],
    ids=[
        "wrong-method", "unknown-path", "malformed-json", "not-json", "not-an-object",
        "nested-too-deep", "unknown-model", "count-unknown-model", "unknown-model-info",
        "bad-page-size",
    ],
)  # fmt: skip
def test_every_error_on_anthropics_paths_comes_in_anthropics_envelope(
    live_server, funded_key, method, path, kwargs, status, kind
):
    # The parameters are shared by every database's run: read, never popped.
    headers = {"x-api-key": funded_key.key, "anthropic-version": "2023-06-01"}
    headers.update(kwargs.get("headers", {}))
    body = {key: value for key, value in kwargs.items() if key != "headers"}

    response = requests.request(
        method, f"{live_server.url}{path}", headers=headers, timeout=30, **body
    )

    envelope(response, status, kind)
    if status == 405:
        assert "POST" in response.headers["Allow"]


def test_a_missing_key_is_401_and_not_worth_retrying(live_server):
    response = requests.post(
        f"{live_server.url}/v1/messages",
        json={"model": "dev-chat", "max_tokens": 5, "messages": HELLO},
        timeout=30,
    )

    assert "API key" in envelope(response, 401, "authentication_error")
    assert response.headers["x-should-retry"] == "false"


def test_the_other_doors_keep_openais_envelope(live_server, funded_key):
    headers = {"Authorization": f"Bearer {funded_key.key}"}
    chat = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers=headers,
        json={"model": "no-such-model", "messages": HELLO},
        timeout=30,
    )
    model = requests.get(f"{live_server.url}/v1/models/no-such-model", headers=headers, timeout=30)

    for response, status in ((chat, 400), (model, 404)):
        assert response.status_code == status
        assert response.json()["error"]["code"] == "model_not_found"


def test_a_body_over_the_size_limit_is_413_request_too_large(live_server, funded_key):
    big = "x" * (17 * 1024 * 1024)
    body = {"model": "dev-chat", "max_tokens": 5, "messages": [{"role": "user", "content": big}]}

    response = post(live_server, funded_key.key, body)

    envelope(response, 413, "request_too_large")


def test_a_prompt_past_the_context_is_refused_as_anthropic_words_it_before_any_hold(
    app, live_server, funded_key
):
    system = [{"type": "text", "text": "word " * 40_000}]
    body = {"model": "dev-chat", "max_tokens": 5, "system": system, "messages": HELLO}

    message = envelope(post(live_server, funded_key.key, body), 400, "invalid_request_error")

    assert re.fullmatch(r"prompt is too long: (\d+) tokens > 32768 maximum", message)
    assert int(message.split()[4]) > 32768
    _, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert generations == charges == holds == []


def test_hostile_shapes_are_refused_or_answered_and_the_worker_serves_on(
    app, live_server, funded_key
):
    many_blocks = [{"type": "text", "text": f"b{i}"} for i in range(5000)]
    deep_schema: dict = {"type": "string"}
    for _ in range(4):
        deep_schema = {"type": "array", "minItems": 64, "items": deep_schema}
    too_wide = {
        "model": "dev-chat",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "Call fill"}],
        "tools": [{"name": "fill", "input_schema": deep_schema}],
        "tool_choice": {"type": "tool", "name": "fill"},
    }
    too_many_tools = {
        "model": "dev-chat",
        "max_tokens": 5,
        "messages": HELLO,
        "tools": [{"name": f"t{i}", "input_schema": {"type": "object"}} for i in range(600)],
    }

    answered = post(
        live_server,
        funded_key.key,
        {
            "model": "dev-chat",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": many_blocks}],
        },
    )
    wide = post(live_server, funded_key.key, too_wide)
    many = post(live_server, funded_key.key, too_many_tools)

    assert answered.status_code == 200 and answered.json()["stop_reason"] == "max_tokens"
    assert "too large to generate" in envelope(wide, 400, "invalid_request_error")
    assert envelope(many, 400, "invalid_request_error") == "tools must hold at most 512 tools."
    _, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert len(generations) == len(charges) == len(holds) == 1
    assert post(
        live_server, funded_key.key, {"model": "dev-chat", "max_tokens": 5, "messages": HELLO}
    ).ok


def wait_for_generation(app, account_id: int) -> list:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if generations := billing_records(app, account_id)[1]:
            return generations
        time.sleep(0.05)
    raise AssertionError("the generation was never settled")


def test_a_caller_hanging_up_mid_stream_is_billed_once_for_what_it_received(
    app, live_server, funded_key
):
    body = {
        "model": "dev-slow",
        "max_tokens": 500,
        "stream": True,
        "messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(300))}],
    }
    response = post(live_server, funded_key.key, body, stream=True)
    lines = response.iter_lines()
    received = 0
    while received < 10:
        line = next(lines)
        received += line.startswith(b'data: {"type":"content_block_delta"')
    response.close()

    (generation,) = wait_for_generation(app, funded_key.account_id)
    account, _, charges, holds = billing_records(app, funded_key.account_id)
    assert (generation.api, generation.status) == ("messages", "cancelled")
    assert 10 <= generation.completion_tokens < 500
    assert [charge.amount for charge in charges] == [-generation.cost]
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0


def test_a_repeated_idempotency_key_replays_the_message_charged_once(app, live_server, funded_key):
    body = {"model": "dev-chat", "max_tokens": 30, "messages": HELLO}
    headers = {"Idempotency-Key": "retry-of-one-message"}

    first = post(live_server, funded_key.key, body, headers=headers)
    again = post(live_server, funded_key.key, body, headers=headers)

    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true" and again.json() == first.json()
    (generation,) = billing_records(app, funded_key.account_id)[1]
    assert generation.id == first.json()["id"] and generation.id.startswith("msg_")


def test_anthropics_model_list_pages_by_id_and_openais_stays_for_others(live_server, funded_key):
    anthropic_headers = {"x-api-key": funded_key.key, "anthropic-version": "2023-06-01"}

    def page(query: str) -> dict:
        url = f"{live_server.url}/v1/models{query}"
        response = requests.get(url, headers=anthropic_headers, timeout=30)
        assert response.status_code == 200
        return response.json()

    first, second = page("?limit=2"), page("?limit=2&after_id=dev-chat-mini")
    before = page("?limit=1&before_id=dev-slow")
    openai = requests.get(
        f"{live_server.url}/v1/models",
        headers={"Authorization": f"Bearer {funded_key.key}"},
        timeout=30,
    ).json()

    assert [model["id"] for model in first["data"]] == ["dev-chat", "dev-chat-mini"]
    assert (first["has_more"], first["first_id"], first["last_id"]) == (
        True,
        "dev-chat",
        "dev-chat-mini",
    )
    assert [model["id"] for model in second["data"]] == ["dev-slow", "dev-dying"]
    assert second["has_more"] is False
    assert [model["id"] for model in before["data"]] == ["dev-chat-mini"]
    assert first["data"][0] == {
        "type": "model",
        "id": "dev-chat",
        "display_name": "dev-chat",
        "created_at": "2023-11-14T22:13:20Z",
    }
    assert openai["object"] == "list" and openai["data"][0]["object"] == "model"


def test_count_tokens_is_free_and_rate_limited(app, database_url, tmp_path, funded_key):
    body = {"model": "dev-chat", "messages": HELLO, "system": "Be brief."}
    with running_server(database_url, tmp_path, RATE_LIMIT="2 per 5 second") as server:
        counted = [
            post(server, funded_key.key, body, "/v1/messages/count_tokens") for _ in range(3)
        ]

    assert [response.status_code for response in counted[:2]] == [200, 200]
    assert counted[0].json() == {"input_tokens": 16}  # 4 + 3 (system), 4 + 2 (user), 3 (reply)
    envelope(counted[2], 429, "rate_limit_error")
    assert int(counted[2].headers["Retry-After"]) >= 1
    assert billing_records(app, funded_key.account_id)[1:] == ([], [], [])


def test_metrics_and_the_access_line_name_the_messages_api(app, database_url, tmp_path, funded_key):
    token = "metrics-token-of-the-messages-test"
    body = {"model": "dev-chat-mini", "max_tokens": 20, "messages": HELLO}
    with running_server(database_url, tmp_path, METRICS_TOKEN=token) as server:
        assert post(server, funded_key.key, body).status_code == 200
        time.sleep(0.3)  # the access line and metrics are written as the response closes
        scraped = requests.get(
            f"{server.url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).text

    (generation,) = billing_records(app, funded_key.account_id)[1]
    costs = {
        sample.labels["api"]: sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if sample.name == "gateway_cost_usd_total" and sample.labels["model"] == "dev-chat-mini"
    }
    assert costs == {"messages": pytest.approx(float(generation.cost))}
    log = next(tmp_path.glob("gunicorn-*.log")).read_text()
    assert f"api=messages upstream=builtin generation_id={generation.id}" in log
