"""POST /v1/responses over raw HTTP: its events on the wire, its errors, its money, its bounds."""

from __future__ import annotations

import json
import threading
import time
from decimal import Decimal

import requests

from app.accounts.keys import revoke_key
from app.encoding import loads
from app.extensions import db
from app.responses.models import StoredResponse
from app.responses.store import MAX_CHAIN_LENGTH, Chain, save_response
from tests.conftest import running_server
from tests.contract.conftest import billing_records

HELLO = {"model": "dev-chat", "input": "Hello there"}


def post(server, key, body, **kwargs):
    return requests.post(
        f"{server.url}/v1/responses",
        headers={"Authorization": f"Bearer {key}"} if key else {},
        json=body,
        timeout=30,
        **kwargs,
    )


def events_of(text: str) -> list[tuple[str, dict]]:
    """Each event of a stream: its ``event:`` name and its decoded data."""
    events = []
    for block in text.strip().split("\n\n"):
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), block
        events.append((name_line[7:], json.loads(data_line[6:], parse_float=Decimal)))
    return events


def balance_of(app, account_id):
    account = billing_records(app, account_id)[0]
    return account.balance


def wait_for_generations(app, account_id, count, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        generations = billing_records(app, account_id)[1]
        if len(generations) >= count:
            return billing_records(app, account_id)
        time.sleep(0.05)
    raise AssertionError("the generations were never settled")


def test_each_event_is_named_by_its_type_and_no_done_marker_ends_the_stream(
    live_server, funded_key
):
    response = post(live_server, funded_key.key, {**HELLO, "stream": True})

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert "[DONE]" not in response.text
    events = events_of(response.text)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[-1][0] == "response.completed"
    usage = events[-1][1]["response"]["usage"]
    assert usage["cost"]["total_cost"] > 0


def test_errors_are_the_envelope_and_cost_nothing(app, live_server, make_funded_key):
    funded = make_funded_key(Decimal("5"))
    broke = make_funded_key(Decimal("0"))
    tools = {"tools": [{"type": "function", "name": "f"}]}
    forced = {**HELLO, **tools, "tool_choice": {"type": "function", "name": "g"}}
    reference = {**HELLO, "input": [{"type": "item_reference", "id": "msg_nope"}]}
    cases = [
        (None, HELLO, 401, "invalid_api_key", None),
        (broke.key, HELLO, 402, "insufficient_quota", None),
        (funded.key, {**HELLO, "model": "no-such-model"}, 400, "model_not_found", "model"),
        (funded.key, {**HELLO, "model": "dev-hidden"}, 400, "model_not_found", "model"),
        (funded.key, {"model": "dev-chat", "input": 5}, 400, None, "input"),
        (funded.key, {**HELLO, "input": [{"role": "user"}]}, 400, None, "input[0].content"),
        (funded.key, {**HELLO, "max_output_tokens": 9000}, 400, None, "max_output_tokens"),
        (funded.key, {**HELLO, "background": True}, 400, None, "background"),
        (funded.key, {**HELLO, "conversation": "conv_1"}, 400, None, "conversation"),
        (
            funded.key,
            {**HELLO, "previous_response_id": "resp_x"},
            404,
            None,
            "previous_response_id",
        ),
        (funded.key, reference, 404, "item_not_found", "input[0].id"),
        (funded.key, forced, 400, None, "tool_choice"),
    ]
    for key, body, status, code, param in cases:
        response = post(live_server, key, body)
        assert response.status_code == status, (body, response.text)
        error = response.json()["error"]
        assert set(error) == {"message", "type", "code", "param"}
        assert (error["param"], code or error["code"]) == (param, error["code"]), body
    created = post(live_server, funded.key, HELLO).json()
    spent = Decimal(str(created["usage"]["cost"]["total_cost"]))
    headers = {"Authorization": f"Bearer {funded.key}"}
    base = f"{live_server.url}/v1/responses/{created['id']}"
    assert requests.get(base, headers=headers, timeout=30).status_code == 200
    assert requests.get(f"{base}/input_items", headers=headers, timeout=30).status_code == 200
    assert requests.delete(base, headers=headers, timeout=30).status_code == 200
    assert balance_of(app, funded.account_id) == Decimal("5") - spent
    assert balance_of(app, broke.account_id) == 0


def test_a_revoked_key_is_refused_with_403(app, live_server, funded_key):
    with app.app_context():
        revoke_key(funded_key.key_id)

    response = post(live_server, funded_key.key, HELLO)

    assert response.status_code == 403
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_over_the_rate_limit_is_429_with_retry_after(app, database_url, tmp_path, funded_key):
    with running_server(database_url, tmp_path, RATE_LIMIT="1 per 10 second") as server:
        assert post(server, funded_key.key, HELLO).status_code == 200
        response = post(server, funded_key.key, HELLO)

    assert response.status_code == 429
    assert 1 <= int(response.headers["Retry-After"]) <= 10
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_a_stream_broken_by_its_upstream_ends_with_error_then_failed(app, live_server, funded_key):
    body = {"model": "dev-dying", "input": "one two three four five six seven", "stream": True}

    events = events_of(post(live_server, funded_key.key, body).text)

    names = [name for name, _ in events]
    assert names[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert names[-2:] == ["error", "response.failed"]
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    error = events[-2][1]
    assert error["code"] == "upstream_error" and error["error"]["code"] == "upstream_error"
    failed = events[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "upstream_error"
    delivered = "".join(d["delta"] for n, d in events if n == "response.output_text.delta")
    assert failed["output"][0]["content"][0]["text"] == delivered
    _, (generation,), charges, _ = wait_for_generations(app, funded_key.account_id, 1)
    assert generation.status == "failed" and generation.api == "responses"
    assert generation.completion_tokens == 5 and [-c.amount for c in charges] == [generation.cost]


def test_a_caller_who_hangs_up_stops_the_stream_and_is_billed_once(app, live_server, funded_key):
    body = {"model": "dev-slow", "input": " ".join(f"w{i}" for i in range(200)), "stream": True}
    with post(live_server, funded_key.key, body, stream=True) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(30)]

    _, (generation,), charges, holds = wait_for_generations(app, funded_key.account_id, 1)
    assert generation.status == "cancelled" and generation.api == "responses"
    deltas = [
        line for line in received if b"output_text.delta" in line and line.startswith(b"data")
    ]
    assert len(deltas) <= generation.completion_tokens < 200
    assert [-c.amount for c in charges] == [generation.cost] and holds[0].status == "settled"


def test_the_balance_falls_by_exactly_the_costs_received(app, live_server, make_funded_key):
    funded = make_funded_key(Decimal("2"))
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    costs, previous = [], None
    for index in range(8):
        body = {
            "model": "dev-chat" if index % 2 else "dev-chat-mini",
            "input": f"Use get_weather {index}",
            "tools": [tool],
            "stream": index % 3 == 0,
            "reasoning": {"effort": "low"},
        }
        if previous:
            body["previous_response_id"] = previous
        response = post(live_server, funded.key, body)
        assert response.status_code == 200, response.text
        if body["stream"]:
            final = events_of(response.text)[-1][1]["response"]
        else:
            final = json.loads(response.content, parse_float=Decimal)
        previous = final["id"]
        costs.append(Decimal(str(final["usage"]["cost"]["total_cost"])))
    chat = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {funded.key}"},
        json={"model": "dev-chat", "messages": [{"role": "user", "content": "Hi"}]},
        timeout=30,
    )
    costs.append(json.loads(chat.content, parse_float=Decimal)["usage"]["cost"]["total_cost"])

    account, generations, charges, _ = billing_records(app, funded.account_id)
    assert account.balance == Decimal("2") - sum(costs) and account.reserved == 0
    assert sorted(g.api for g in generations) == ["chat"] + ["responses"] * 8
    assert sorted(g.cost for g in generations) == sorted(costs)


def test_an_idempotency_key_replays_the_response_and_charges_once(app, live_server, funded_key):
    headers = {"Authorization": f"Bearer {funded_key.key}", "Idempotency-Key": "retry-1"}
    url = f"{live_server.url}/v1/responses"

    first = requests.post(url, headers=headers, json=HELLO, timeout=30)
    again = requests.post(url, headers=headers, json=HELLO, timeout=30)

    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true" and again.json() == first.json()
    _, generations, _, _ = billing_records(app, funded_key.account_id)
    assert [g.id for g in generations] == [first.json()["id"]]


def test_huge_and_deep_input_is_refused_quickly(app, live_server, funded_key):
    huge = {"model": "dev-chat", "input": "word " * 3_000_000}
    deep: object = "x"
    for _ in range(70):
        deep = [deep]
    many = {"model": "dev-chat", "input": [{"role": "user", "content": "hi"}] * 10_001}

    answers = [
        post(live_server, funded_key.key, body) for body in (huge, {**HELLO, "input": deep}, many)
    ]

    assert [a.status_code for a in answers] == [400, 400, 400]
    assert answers[0].json()["error"]["code"] == "context_length_exceeded"
    assert answers[1].json()["error"]["code"] == "invalid_json"
    assert answers[2].json()["error"]["param"] == "input"
    assert post(live_server, funded_key.key, HELLO).status_code == 200
    assert balance_of(app, funded_key.account_id) < Decimal("10")


def store_chain(app, account_id: int, length: int) -> str:
    """Store a chain of ``length`` responses for the account; return the newest's id."""
    chain = Chain()
    with app.app_context():
        for index in range(length):
            response = {"id": f"resp_{account_id:08x}{index:032x}", "output": []}
            save_response(
                account_id=account_id, chain=chain, input_items=[], response=response, ttl_days=1
            )
            chain = Chain(response["id"], [], chain.length + 1, chain.size + 40)
    return chain.response_id


def test_a_chain_too_long_is_refused_before_it_is_read(app, live_server, funded_key):
    newest = store_chain(app, funded_key.account_id, 1000)

    response = post(live_server, funded_key.key, {**HELLO, "previous_response_id": newest})

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("conversation_too_long", "previous_response_id")
    assert str(MAX_CHAIN_LENGTH) in error["message"]
    assert billing_records(app, funded_key.account_id)[1] == []
    assert post(live_server, funded_key.key, HELLO).status_code == 200


def test_a_chain_within_its_bounds_is_continued_whole(app, live_server, funded_key):
    newest = store_chain(app, funded_key.account_id, MAX_CHAIN_LENGTH - 1)

    response = post(live_server, funded_key.key, {**HELLO, "previous_response_id": newest})

    assert response.status_code == 200, response.text
    assert (
        post(
            live_server, funded_key.key, {**HELLO, "previous_response_id": response.json()["id"]}
        ).status_code
        == 400
    )


def test_a_response_deleted_while_a_continuation_runs(app, live_server, funded_key):
    headers = {"Authorization": f"Bearer {funded_key.key}"}
    first = post(live_server, funded_key.key, HELLO).json()
    body = {
        "model": "dev-slow",
        "input": "one two three",
        "previous_response_id": first["id"],
        "stream": True,
    }
    with post(live_server, funded_key.key, body, stream=True) as streaming:
        lines = streaming.iter_lines()
        next(lines)
        deleted = requests.delete(
            f"{live_server.url}/v1/responses/{first['id']}", headers=headers, timeout=30
        )
        rest = b"\n".join(lines).decode()

    assert deleted.status_code == 200
    completed = json.loads(rest.split("event: response.completed\ndata: ")[1])["response"]
    assert completed["status"] == "completed"
    refused = post(live_server, funded_key.key, {**HELLO, "previous_response_id": completed["id"]})
    assert refused.status_code == 404
    assert "deleted or expired" in refused.json()["error"]["message"]
    assert post(live_server, funded_key.key, HELLO).status_code == 200


def test_stored_content_stays_out_of_logs_and_metrics(app, database_url, tmp_path, funded_key):
    marker = "zebra-marker-7d1f"
    with running_server(database_url, tmp_path, METRICS_TOKEN="metrics-secret") as server:
        created = post(
            server, funded_key.key, {"model": "dev-chat", "input": f"Hello {marker}"}
        ).json()
        assert marker in created["output"][0]["content"][0]["text"]
        stream = post(
            server, funded_key.key, {"model": "dev-chat", "input": marker, "stream": True}
        )
        assert marker in stream.text
        metrics = requests.get(
            f"{server.url}/metrics", headers={"Authorization": "Bearer metrics-secret"}, timeout=30
        ).text

    assert marker not in metrics
    assert 'gateway_cost_usd_total{api="responses",model="dev-chat"}' in metrics
    log = next(tmp_path.glob("gunicorn-*.log")).read_text()
    assert created["id"] in log and marker not in log
    with app.app_context():
        stored = db.session.get(StoredResponse, created["id"])
        assert marker in loads(stored.input_items)[0]["content"][0]["text"]


def test_concurrent_continuations_of_one_response_each_answer(app, live_server, funded_key):
    first = post(live_server, funded_key.key, HELLO).json()
    statuses: list[int] = []

    def continue_it(index: int) -> None:
        body = {**HELLO, "input": f"turn {index}", "previous_response_id": first["id"]}
        statuses.append(post(live_server, funded_key.key, body).status_code)

    threads = [threading.Thread(target=continue_it, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert statuses == [200] * 6
