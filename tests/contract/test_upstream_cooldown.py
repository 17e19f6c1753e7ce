"""An upstream that keeps failing is skipped for its cooldown, then probed by one request."""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from decimal import Decimal

import pytest
import redis
import requests
from prometheus_client.parser import text_string_to_metric_families

from app.providers.cooldown import RedisCooldowns, upstream_cooldowns
from tests.conftest import running_server
from tests.upstream_server import ReplayServer, Reply

REDIS_URL = "redis://127.0.0.1:6379/0"
COOLDOWN_SECONDS = 3
TOKEN = "cooldown-metrics-token"
CATALOG = """
[upstreams.{down}]
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
retries = 0
cooldown_after = 2
cooldown_seconds = {seconds}

[upstreams.up]
kind = "openai"
base_url = "{url}/up/v1"
retries = 0

[[models]]
id = "failover"
max_output_tokens = 512
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [
  {{ upstream = "{down}", model = "m" }},
  {{ upstream = "up", model = "m" }},
]
"""


class RefusingServer:
    """Accepts each connection and resets it at once, counting them."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.stopping = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            # Linger 0: close() sends a reset, as a crashed server's kernel would.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()


@pytest.fixture
def refusing():
    server = RefusingServer()
    yield server
    server.close()


@pytest.fixture
def replay():
    server = ReplayServer()
    yield server
    server.close()


def cooldown_seconds_left(server, upstream: str) -> float:
    response = requests.get(
        f"{server.url}/metrics",
        headers={"Authorization": f"Bearer {TOKEN}", "Connection": "close"},
        timeout=30,
    )
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name == "gateway_upstream_cooldown_seconds" and sample.labels == {
                "upstream": upstream
            }:
                return sample.value
    raise AssertionError(f"no cooldown gauge for {upstream}")


@pytest.mark.parametrize("shared", [False, True], ids=["per-worker", "shared-through-redis"])
def test_a_failing_first_route_is_skipped_until_its_cooldown_ends(
    database_url, tmp_path, make_funded_key, refusing, replay, shared
):
    down = f"down-{uuid.uuid4().hex[:8]}"  # Redis outlives the test: a name of its own
    catalog = tmp_path / "models.toml"
    catalog.write_text(
        CATALOG.format(down=down, port=refusing.port, url=replay.url, seconds=COOLDOWN_SECONDS)
    )
    funded = make_funded_key(Decimal("5"))
    env = {"REDIS_URL": REDIS_URL, "WEB_CONCURRENCY": "2"} if shared else {}
    replay.script("/up", *[Reply("openai_chat")] * 8)

    def ask() -> int:
        return requests.post(
            f"{server.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {funded.key}", "Connection": "close"},
            json={"model": "failover", "messages": [{"role": "user", "content": "Hi"}]},
            timeout=30,
        ).status_code

    with running_server(
        database_url, tmp_path, catalog=str(catalog), METRICS_TOKEN=TOKEN, **env
    ) as server:
        statuses = [ask() for _ in range(2)]
        tried_before_cooldown = refusing.connections
        statuses += [ask() for _ in range(4)]
        tried_during_cooldown = refusing.connections
        cooling = cooldown_seconds_left(server, down)
        time.sleep(COOLDOWN_SECONDS + 0.5)
        statuses += [ask() for _ in range(2)]

    assert statuses == [200] * 8
    assert tried_before_cooldown == 2
    assert tried_during_cooldown == 2, "a cooling upstream must see no calls"
    assert 0 < cooling <= COOLDOWN_SECONDS
    # After the cooldown one request probes it; it fails, so the cooldown starts again.
    assert refusing.connections == 3
    assert len(replay.exchanges) == 8


def test_catalog_list_shows_an_upstream_cooling_down(app, runner):
    upstream = app.extensions["catalog"].resolve("dev-slow").routes[0].adapter.upstream
    upstream_cooldowns.configure(redis_url=REDIS_URL)
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for _ in range(3):
            upstream_cooldowns.note_failure(upstream)
        result = runner.invoke(args=["catalog", "list"])
    finally:
        client.delete(*RedisCooldowns.keys(upstream.name))
        upstream_cooldowns.configure(redis_url=None)
    after = runner.invoke(args=["catalog", "list"])

    (line,) = [row for row in result.output.splitlines() if row.startswith("dev-slow\t")]
    assert "builtin-slow:dev-slow (cooling down, 30s left)" in line
    assert "cooling" not in after.output
