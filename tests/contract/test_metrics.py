"""GET /metrics: Prometheus text summed over gunicorn's workers, for the scraper only."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import running_server
from tests.contract.conftest import billing_records, open_slow_stream

TOKEN = "metrics-scrape-token-for-tests"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def gateway(app, database_url, tmp_path_factory):
    """Gunicorn with two workers and a METRICS_TOKEN."""
    folder = tmp_path_factory.mktemp("metrics")
    with running_server(database_url, folder, METRICS_TOKEN=TOKEN, WEB_CONCURRENCY="2") as server:
        yield server


def scrape(server, token=TOKEN) -> requests.Response:
    # A new connection each time, so that scrapes land on either worker.
    return requests.get(
        f"{server.url}/metrics",
        headers={"Authorization": f"Bearer {token}", "Connection": "close"},
        timeout=30,
    )


def samples(server) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape, by name and labels."""
    response = scrape(server)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(found, name, **labels) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def ask(server, key, **body):
    return requests.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}", "Connection": "close"},
        json={"model": "dev-chat-mini", "messages": HELLO, **body},
        timeout=30,
    )


def test_without_a_metrics_token_metrics_are_not_served(live_server):
    response = requests.get(f"{live_server.url}/metrics", headers={"Authorization": "Bearer x"})

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer "])
def test_metrics_need_the_token(gateway, authorization):
    headers = {"Authorization": authorization} if authorization else {}

    response = requests.get(f"{gateway.url}/metrics", headers=headers, timeout=30)

    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "code", "param"}


def test_counts_are_summed_over_the_workers(app, gateway, make_funded_key):
    funded = make_funded_key(Decimal("5"))
    before = samples(gateway)
    route = {"route": "/v1/chat/completions"}
    answers = [ask(gateway, funded.key) for _ in range(6)]
    answers.append(ask(gateway, funded.key, stream=True, stream_options={"include_usage": True}))
    refused = ask(gateway, "sk-gw-not-a-key")
    requests.get(f"{gateway.url}/v1/nowhere", headers={"Connection": "close"})
    assert [a.status_code for a in answers] == [200] * 7 and refused.status_code == 401
    _, generations, _, _ = billing_records(app, funded.account_id)
    charged = sum(g.cost for g in generations)

    time.sleep(0.3)  # the stream's line and metrics are recorded as it closes
    scrapes = [samples(gateway) for _ in range(4)]

    for found in scrapes:
        grew = [
            value(found, name, **labels) - value(before, name, **labels)
            for name, labels in [
                ("gateway_requests_total", {**route, "status": "200", "error_code": ""}),
                (
                    "gateway_requests_total",
                    {**route, "status": "401", "error_code": "invalid_api_key"},
                ),
                (
                    "gateway_requests_total",
                    {"route": "unmatched", "status": "404", "error_code": "not_found"},
                ),
                (
                    "gen_ai_client_token_usage_count",
                    {
                        "gen_ai_operation_name": "chat",
                        "gen_ai_request_model": "dev-chat-mini",
                        "gen_ai_token_type": "input",
                    },
                ),
                (
                    "gen_ai_server_time_to_first_token_seconds_count",
                    {"gen_ai_operation_name": "chat", "gen_ai_request_model": "dev-chat-mini"},
                ),
                (
                    "gateway_upstream_attempts_total",
                    {"upstream": "builtin", "outcome": "ok"},
                ),
            ]
        ]
        assert grew == [7, 1, 1, 7, 1, 7]
        cost = value(found, "gateway_cost_usd_total", model="dev-chat-mini", api="chat") - value(
            before, "gateway_cost_usd_total", model="dev-chat-mini", api="chat"
        )
        assert cost == pytest.approx(float(charged), rel=1e-6)


def test_no_metric_names_a_key_or_an_account(gateway, funded_key):
    ask(gateway, funded_key.key)

    found = samples(gateway)

    label_names = {name for _, labels in found for name, _ in labels}
    assert not {name for name in label_names if "key" in name or "account" in name}
    assert funded_key.key[:12] not in scrape(gateway).text


def test_streams_in_flight_and_open_holds_show_while_a_stream_runs(gateway, funded_key):
    stream = open_slow_stream(gateway.url, funded_key.key, words=40)
    assert stream.status_code == 200
    next(stream.iter_lines())

    during = samples(gateway)
    stream.close()
    deadline = time.monotonic() + 5
    while value(after := samples(gateway), "gateway_streams_in_flight") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)

    assert value(during, "gateway_streams_in_flight") == 1
    assert value(during, "gateway_holds_open") >= 1
    assert value(during, "gateway_holds_open_usd") > 0
    assert value(after, "gateway_streams_in_flight") == 0
