"""Too many requests: 429 in the envelope, per API key, shared across workers via Redis."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
import requests

from app.auth.keys import generate_key
from tests.conftest import _free_port, running_server

HELLO = [{"role": "user", "content": "hello"}]


def client_for(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)


def test_a_key_over_its_limit_gets_429_others_do_not(database_url, tmp_path, make_funded_key):
    busy, quiet = make_funded_key(), make_funded_key()
    with running_server(database_url, tmp_path, RATE_LIMIT="3 per minute") as server:
        client = client_for(server, busy.key)
        for _ in range(3):
            client.chat.completions.create(model="dev-chat-mini", messages=HELLO)
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model="dev-chat-mini", messages=HELLO)
        assert client_for(server, quiet.key).models.list().data
        probes = [requests.get(f"{server.url}/healthz").status_code for _ in range(5)]

    response = caught.value.response
    assert response.status_code == 429
    assert int(response.headers["Retry-After"]) > 0
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "3 per 1 minute" in error["message"]
    assert probes == [200] * 5


def test_limits_are_shared_by_workers_through_redis(database_url, tmp_path, make_funded_key):
    funded = make_funded_key()
    # A Redis of its own: key ids start over in each test database, and the shared Redis
    # would still hold the count of another run's key with the same id.
    port = _free_port()
    with (
        private_redis(port),
        running_server(
            database_url,
            tmp_path,
            RATE_LIMIT="4 per minute",
            REDIS_URL=f"redis://127.0.0.1:{port}/0",
            WEB_CONCURRENCY="2",
        ) as server,
    ):
        statuses = [
            requests.get(
                f"{server.url}/v1/models",
                headers={"Authorization": f"Bearer {funded.key}", "Connection": "close"},
                timeout=30,
            ).status_code
            for _ in range(8)
        ]
    assert statuses == [200] * 4 + [429] * 4


def get_models(server, key: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.get(f"{server.url}/v1/models", headers=headers, timeout=30)


def rate_limit_headers(response: requests.Response) -> list[str]:
    return [
        name for name in response.headers if name.lower().startswith(("retry-after", "x-ratelimit"))
    ]


def test_unknown_keys_share_their_address_counter_known_keys_keep_their_own(
    database_url, tmp_path, make_funded_key
):
    funded = make_funded_key()
    with running_server(database_url, tmp_path, RATE_LIMIT="3 per minute") as server:
        made_up = [get_models(server, generate_key()) for _ in range(4)]
        keyless = get_models(server, None)
        known = [get_models(server, funded.key) for _ in range(4)]

    # Each made-up key is well-formed, so each would have had a counter of its own.
    assert [response.status_code for response in made_up] == [401, 401, 401, 429]
    assert keyless.status_code == 429
    assert [response.status_code for response in known] == [200, 200, 200, 429]
    assert made_up[-1].json()["error"]["code"] == "rate_limit_exceeded"


def test_retry_after_is_sent_on_429_only(database_url, tmp_path, make_funded_key):
    funded = make_funded_key()
    with running_server(database_url, tmp_path, RATE_LIMIT="2 per minute") as server:
        answers = [get_models(server, funded.key) for _ in range(3)]

    assert [response.status_code for response in answers] == [200, 200, 429]
    assert rate_limit_headers(answers[0]) == rate_limit_headers(answers[1]) == []
    assert rate_limit_headers(answers[2]) == ["Retry-After"]
    assert 0 < int(answers[2].headers["Retry-After"]) <= 60


def gunicorn_log(log_dir: Path) -> str:
    return "".join(path.read_text() for path in log_dir.glob("gunicorn-*.log"))


def test_an_unreachable_redis_falls_back_to_per_worker_limits(
    database_url, tmp_path, make_funded_key
):
    funded = make_funded_key()
    closed = f"redis://127.0.0.1:{_free_port()}/0"
    with running_server(
        database_url,
        tmp_path,
        RATE_LIMIT="3 per minute",
        REDIS_URL=closed,
        METRICS_TOKEN="scrape-token",
    ) as server:
        statuses = [get_models(server, funded.key).status_code for _ in range(5)]
        ready = requests.get(f"{server.url}/readyz", timeout=30)
        scraped = requests.get(
            f"{server.url}/metrics",
            headers={"Authorization": "Bearer scrape-token"},
            timeout=30,
        ).text

    assert statuses == [200, 200, 200, 429, 429]
    assert "gateway_rate_limit_store_fallbacks_total 1.0" in scraped
    assert ready.status_code == 200
    assert ready.json() == {"status": "degraded", "redis": "unreachable"}
    assert gunicorn_log(tmp_path).count("Rate limit storage unreachable") == 1


@contextmanager
def private_redis(port: int) -> Iterator[subprocess.Popen]:
    """Run a redis-server of our own on ``port``, without persistence, until the block ends."""
    process = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: redis_cli(port, "PING") == "PONG")
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)


def redis_cli(port: int, *command: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *command], capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def _wait_for(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.2)


def test_a_redis_that_stops_and_comes_back(database_url, tmp_path, make_funded_key):
    funded = make_funded_key()
    port = _free_port()
    with private_redis(port) as redis:
        with running_server(
            database_url, tmp_path, REDIS_URL=f"redis://127.0.0.1:{port}/0"
        ) as server:
            before = get_models(server, funded.key).status_code
            ready_before = requests.get(f"{server.url}/readyz", timeout=30).json()
            counted = redis_cli(port, "KEYS", "*gateway*")
            redis.terminate()
            redis.wait(timeout=30)
            during = [get_models(server, funded.key).status_code for _ in range(5)]
            ready_during = requests.get(f"{server.url}/readyz", timeout=30).json()
            with private_redis(port):
                _wait_for(
                    lambda: (
                        requests.get(f"{server.url}/readyz", timeout=30).json()
                        == {"status": "ready"}
                    )
                )
                _wait_for(
                    lambda: (
                        get_models(server, funded.key).status_code == 200
                        and redis_cli(port, "KEYS", "*gateway*") != ""
                    )
                )

    assert before == 200 and counted != ""
    assert ready_before == {"status": "ready"}
    assert during == [200] * 5
    assert ready_during == {"status": "degraded", "redis": "unreachable"}
    log = gunicorn_log(tmp_path)
    assert log.count("Rate limit storage unreachable") == 1
    assert "Rate limit storage recovered" in log


# Commands a Redis client sends once per connection, not per request.
CONNECTION_COMMANDS = ("cmdstat_client", "cmdstat_hello", "cmdstat_select", "cmdstat_ping")


def commands_since_reset(port: int) -> dict[str, int]:
    stats = {}
    for line in redis_cli(port, "INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_") and not line.startswith(CONNECTION_COMMANDS):
            name, _, fields = line.partition(":")
            stats[name] = int(fields.split(",")[0].removeprefix("calls="))
    stats.pop("cmdstat_info", None)
    return stats


def test_the_limiter_costs_one_redis_round_trip_per_request(
    database_url, tmp_path, make_funded_key
):
    funded = make_funded_key()
    port = _free_port()
    with private_redis(port):
        with running_server(
            database_url,
            tmp_path,
            RATE_LIMIT="3 per minute",
            REDIS_URL=f"redis://127.0.0.1:{port}/0",
        ) as server:
            redis_cli(port, "CONFIG", "RESETSTAT")
            statuses = [get_models(server, funded.key).status_code for _ in range(5)]
            statuses.append(get_models(server, generate_key()).status_code)
            commands = commands_since_reset(port)

    assert statuses == [200, 200, 200, 429, 429, 401]
    # Commands the counting script runs inside Redis, and the reset above, are no round
    # trips of a request.
    for inside_the_script in ("cmdstat_incrby", "cmdstat_expire", "cmdstat_config|resetstat"):
        commands.pop(inside_the_script, None)
    assert set(commands) <= {"cmdstat_evalsha", "cmdstat_eval", "cmdstat_script|load"}, commands
    # One script call per request; once per process, the first is refused as an unknown
    # script, which is then loaded and called again.
    reloads = commands.get("cmdstat_script|load", 0)
    assert reloads <= 1
    assert commands.get("cmdstat_evalsha", 0) + commands.get("cmdstat_eval", 0) == 6 + reloads
