"""Seeing inside the running service: request ids, access lines, JSON logs, no secrets.

Gunicorn serves a catalog whose model ``relayed`` runs on the replay server behind an
upstream key, so that a request's id and the upstream's key both cross a real HTTP hop.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from app.auth.keys import generate_key
from tests.conftest import TEST_CATALOG, running_server
from tests.contract.conftest import billing_records
from tests.upstream_server import ReplayServer, Reply

UPSTREAM_KEY = "sk-upstream-Zq8v2Lr7Xw4Nc1Tb6Hy3"
CATALOG = """
[upstreams.third]
kind = "openai"
base_url = "{url}/third/v1"
api_key_env = "THIRD_PARTY_KEY"
retries = 0

[[models]]
id = "relayed"
max_output_tokens = 512
pricing = {{ prompt = 0.15, completion = 0.60 }}
routes = [{{ upstream = "third", model = "gpt-4o-mini-2024-07-18" }}]
"""
HELLO = [{"role": "user", "content": "Hello"}]
GENERATED_ID = re.compile(r"req_[0-9a-f]{24}")


def gateway_catalog(folder: Path, upstream: ReplayServer) -> str:
    """Write the test catalog plus the relayed model; return its path."""
    catalog = folder / "models.toml"
    catalog.write_text(Path(TEST_CATALOG).read_text() + CATALOG.format(url=upstream.url))
    return str(catalog)


@dataclass(frozen=True)
class Gateway:
    """The running gateway: its URL, its LOG_FORMAT and its log file."""

    url: str
    log_format: str
    log_path: Path


@pytest.fixture(scope="module")
def upstream():
    server = ReplayServer()
    yield server
    server.close()


@pytest.fixture(scope="module", params=["json", "text"])
def gateway(request, app, database_url, upstream, tmp_path_factory):
    """Gunicorn with two workers, logging in each format, the upstream's key in its env."""
    folder = tmp_path_factory.mktemp(f"observed-{request.param}")
    with running_server(
        database_url,
        folder,
        catalog=gateway_catalog(folder, upstream),
        LOG_FORMAT=request.param,
        THIRD_PARTY_KEY=UPSTREAM_KEY,
        WEB_CONCURRENCY="2",
    ) as server:
        yield Gateway(server.url, request.param, next(folder.glob("gunicorn-*.log")))


@pytest.fixture(autouse=True)
def scripted(upstream):
    upstream.reset()
    yield upstream
    assert upstream.unused_replies() == {}


def chat(server, key, body, **headers):
    return requests.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", **headers},
        json=body,
        timeout=30,
    )


def log_lines(server) -> list[str]:
    return server.log_path.read_text().splitlines()


def access_lines(server, request_id: str) -> list[dict | str]:
    """The access lines of one request, decoded when the log is JSON.

    A request's line is written when its response is closed, just after its last byte
    was sent: it is waited for.
    """
    deadline = time.monotonic() + 5
    while not read_access_lines(server, request_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # long enough for a second line, if there were one
    return read_access_lines(server, request_id)


def read_access_lines(server, request_id: str) -> list[dict | str]:
    found = []
    for line in log_lines(server):
        if server.log_format == "json":
            record = json.loads(line)
            if record["logger"] == "gateway.access" and record["request_id"] == request_id:
                found.append(record)
        elif "gateway.access" in line and f"[{request_id}]" in line:
            found.append(line)
    return found


def test_a_sane_request_id_is_echoed_on_every_kind_of_response(gateway, funded_key):
    key = funded_key.key
    answers = {
        "models": requests.get(
            f"{gateway.url}/v1/models",
            headers={"Authorization": f"Bearer {key}", "X-Request-Id": "a.b:c-1"},
        ),
        "not found": requests.get(f"{gateway.url}/v1/nowhere", headers={"X-Request-Id": "a.b:c-2"}),
        "bad key": chat(gateway, "sk-gw-wrong", {}, **{"X-Request-Id": "a.b:c-3"}),
        "stream": chat(
            gateway,
            key,
            {"model": "dev-chat", "messages": HELLO, "stream": True},
            **{"X-Request-Id": "a.b:c-4"},
        ),
    }

    assert [r.status_code for r in answers.values()] == [200, 404, 401, 200]
    assert [r.headers["X-Request-Id"] for r in answers.values()] == [
        "a.b:c-1",
        "a.b:c-2",
        "a.b:c-3",
        "a.b:c-4",
    ]
    assert answers["not found"].json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("sent", ["has spaces", "x" * 129, "semi;colon", "é"])
def test_an_unusable_request_id_is_replaced_by_a_generated_one(gateway, sent):
    response = requests.get(
        f"{gateway.url}/healthz", headers={"X-Request-Id": sent.encode().decode("latin-1")}
    )

    assert GENERATED_ID.fullmatch(response.headers["X-Request-Id"])


def test_the_request_id_reaches_the_upstream_the_record_and_one_access_line(
    app, gateway, make_funded_key, scripted
):
    funded = make_funded_key(Decimal("5"))
    # Written in pieces 50 ms apart: the upstream's answer takes at least 150 ms.
    scripted.script("/third", Reply("openai_chat", write_size=256, pause=0.05))

    response = chat(
        gateway, funded.key, {"model": "relayed", "messages": HELLO}, **{"X-Request-Id": "trace-7"}
    )

    assert response.status_code == 200, response.text
    assert response.headers["X-Request-Id"] == "trace-7"
    overhead_ms = float(response.headers["X-Gateway-Overhead-Ms"])
    (exchange,) = scripted.exchanges
    assert exchange.headers["x-request-id"] == "trace-7"
    _, (generation,), _, _ = billing_records(app, funded.account_id)
    assert generation.request_id == "trace-7"
    (attempt,) = generation.upstream_attempts
    assert (attempt["upstream"], attempt["outcome"]) == ("third", "ok")
    assert attempt["duration_ms"] >= 150
    (line,) = access_lines(gateway, "trace-7")
    expected = {
        "status": 200,
        "account_id": funded.account_id,
        "key_id": funded.key_id,
        "model": "relayed",
        "upstream": "third",
        "generation_id": generation.id,
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.completion_tokens,
    }
    if gateway.log_format == "json":
        assert {k: line[k] for k in expected} == expected
        assert Decimal(line["cost"]) == generation.cost > 0
        # The headers left once the upstream had answered; its wait is no overhead.
        assert line["latency_ms"] >= line["ttfb_ms"] >= attempt["duration_ms"]
        assert line["overhead_ms"] == overhead_ms < line["ttfb_ms"] - attempt["duration_ms"] + 1
        assert line["path"] == "/v1/chat/completions"
    else:
        for name, value in expected.items():
            assert f" {name}={value} " in line
        assert Decimal(re.search(r" cost=([0-9.]+) ", line)[1]) == generation.cost > 0
        assert float(re.search(r" overhead_ms=([0-9.]+)$", line)[1]) == overhead_ms


def test_a_stream_has_one_access_line_written_when_it_ends(gateway, funded_key):
    response = chat(
        gateway,
        funded_key.key,
        {"model": "dev-chat", "messages": HELLO, "stream": True},
        **{"X-Request-Id": "stream-9"},
    )

    assert response.text.endswith("data: [DONE]\n\n")
    overhead_ms = float(response.headers["X-Gateway-Overhead-Ms"])
    (line,) = access_lines(gateway, "stream-9")
    # The access line tells the overhead the headers did: until the first chunk was in.
    if gateway.log_format == "json":
        assert line["overhead_ms"] == overhead_ms
    else:
        assert float(re.search(r" overhead_ms=([0-9.]+)$", line)[1]) == overhead_ms
    if gateway.log_format == "json":
        assert line["status"] == 200 and line["completion_tokens"] > 0
        assert line["ttft_ms"] is not None
        # The overhead is the gateway's time until the headers, not the relaying after.
        assert line["overhead_ms"] == float(response.headers["X-Gateway-Overhead-Ms"])


def test_every_line_is_in_the_configured_format(gateway):
    requests.get(f"{gateway.url}/v1/nowhere", headers={"X-Request-Id": "format-1"})
    access_lines(gateway, "format-1")

    lines = log_lines(gateway)

    if gateway.log_format == "json":
        loggers = {json.loads(line)["logger"] for line in lines}
        assert {"gunicorn.error", "gateway.access"} <= loggers
    else:
        text_line = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+ \[[^\]]+\] ")
        assert [line for line in lines if not text_line.match(line)] == []
        assert any(" gunicorn.error [-] Booting worker" in line for line in lines)


def key_fragments(key: str, length: int = 10) -> set[str]:
    """Every piece of ``key`` of ``length`` characters."""
    return {key[i : i + length] for i in range(len(key) - length + 1)}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_no_log_line_carries_a_key_however_it_was_sent(
    gateway, funded_key, make_funded_key, scripted
):
    another = make_funded_key()
    keys = [funded_key.key, generate_key(), "sk-gw-" + "Q" * 40, another.key]
    body = {"model": "dev-chat-mini", "messages": HELLO}
    for key in keys:
        sends = [
            {"headers": {"Authorization": f"Bearer {key}"}},
            {"headers": {"Authorization": basic(key, "")}},
            {"headers": {"Authorization": basic("user", key)}},
            {"headers": {"X-Api-Key": key}},
            {"params": {"api_key": key}},
            {"json": {**body, "api_key": key, "user": key}},
        ]
        for send in sends:
            send.setdefault("json", body)
            requests.post(f"{gateway.url}/v1/chat/completions", timeout=30, **send)
        requests.get(f"{gateway.url}/v1/{key}", timeout=30)
    scripted.script("/third", Reply("openai_chat"), Reply("openai_error_401"))
    for _ in range(2):
        chat(gateway, funded_key.key, {"model": "relayed", "messages": HELLO})
    assert scripted.exchanges[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"

    log = gateway.log_path.read_text()

    assert "upstream third refused the gateway with 401" in log
    for secret in [*keys, UPSTREAM_KEY]:
        leaked = [piece for piece in key_fragments(secret[6:]) if piece in log]
        assert leaked == [], (secret, leaked[:3])
