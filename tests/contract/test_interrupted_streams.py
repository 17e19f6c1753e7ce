"""A stream whose worker is killed is settled, by the sweeper, at no less than it used.

gunicorn routes models to the local replay server. The upstream pauses where a worker
may die (its usage come, its stream not yet ended; or text delivered, its usage not yet
come), the test waits for the worker to record its progress there and kills it; a new
worker's sweeper settles the expired hold at that progress.
"""

from __future__ import annotations

import os
import signal
from decimal import Decimal

import pytest
import requests

from app.catalog.pricing import cost_of
from app.catalog.registry import load_catalog
from app.providers.base import Usage
from tests.conftest import running_server
from tests.contract.test_holds import (
    child_pids,
    generation_of,
    holds_of,
    recorded_progress,
    wait_for,
)
from tests.upstream_server import ReplayServer, Reply

CATALOG = """
[upstreams.third]
kind = "openai"
base_url = "{url}/third/v1"
api_key_env = "THIRD_API_KEY"
tokenizer = "o200k_base"
retries = 0

[upstreams.claude]
kind = "anthropic"
base_url = "{url}/claude"
api_key_env = "CLAUDE_API_KEY"
retries = 0

[[models]]
id = "gpt-mini"
max_output_tokens = 4096
pricing = {{ prompt = 0.15, completion = 0.60, cached_read = 0.075 }}
routes = [{{ upstream = "third", model = "gpt-4o-mini-2024-07-18" }}]

[[models]]
id = "claude-sonnet"
max_output_tokens = 8192
pricing = {{ prompt = 3, completion = 15, cached_read = 0.30 }}
routes = [{{ upstream = "claude", model = "claude-sonnet-4-5-20250929" }}]
"""
HELLO = [{"role": "user", "content": "Hello"}]
# What each transcript's upstream reports for its whole answer.
OPENAI_USAGE = Usage(prompt_tokens=19, completion_tokens=10)
ANTHROPIC_USAGE = Usage(prompt_tokens=21 + 2048, cached_tokens=2048, completion_tokens=10)


@pytest.fixture
def gateway(database_url, tmp_path):
    """Gunicorn (one worker, holds that expire after 2 s) and the replay server it calls."""
    upstream = ReplayServer()
    catalog = tmp_path / "models.toml"
    catalog.write_text(CATALOG.format(url=upstream.url))
    try:
        with running_server(
            database_url,
            tmp_path,
            catalog=str(catalog),
            HOLD_TTL_SECONDS="2",
            THIRD_API_KEY="sk-third",
            CLAUDE_API_KEY="sk-claude",
        ) as server:
            yield server, upstream, load_catalog(catalog)
    finally:
        upstream.close()


def stream_until(server, key: str, model: str, last_text: str) -> tuple[requests.Response, str]:
    """Open a stream; read until ``last_text`` arrived; return it and its generation's id."""
    response = requests.post(
        f"{server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "messages": HELLO, "stream": True},
        stream=True,
        timeout=30,
    )
    received = b""
    for line in response.iter_lines():
        received += line
        if last_text.encode() in line:
            break
    generation_id = received.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode()
    return response, generation_id


def kill_worker_and_wait_for_settlement(app, server, response, generation_id):
    """SIGKILL the one worker; return the generation a new worker's sweeper recorded."""
    (worker,) = child_pids(server.process.pid)
    os.kill(worker, signal.SIGKILL)
    response.close()
    generation = wait_for(lambda: generation_of(app, generation_id), 30)
    assert generation is not None, "the killed stream's hold was never settled"
    return generation


def usage_of(generation) -> Usage:
    return Usage(
        prompt_tokens=generation.prompt_tokens,
        cached_tokens=generation.cached_tokens,
        completion_tokens=generation.completion_tokens,
    )


def test_a_worker_killed_after_the_upstreams_usage_came_is_settled_at_that_usage(
    app, gateway, make_funded_key
):
    server, upstream, catalog = gateway
    funded = make_funded_key(Decimal("5"))
    # The text, then 2.5 s (the worker records what it delivered), then the usage; then
    # the stream's end never comes before the worker dies.
    upstream.script(
        "/third", Reply("openai_chat_stream", pauses=((11, 2.5),), stall_after_events=12)
    )
    response, generation_id = stream_until(server, funded.key, "gpt-mini", '"?"')
    assert wait_for(lambda: recorded_progress(app, generation_id), 10), "no progress recorded"
    # The usage came (not seen by the caller: the gateway sends it with the end); the
    # worker records it with its progress within a second or so.
    wait_for(lambda: (recorded_progress(app, generation_id) or {}).get("prompt_tokens") == 19, 8)

    generation = kill_worker_and_wait_for_settlement(app, server, response, generation_id)

    assert generation.status == "interrupted"
    assert (generation.prompt_tokens, generation.completion_tokens) == (19, 10)
    assert generation.cost == cost_of(OPENAI_USAGE, catalog.resolve("gpt-mini").pricing)
    account, statuses, charges = holds_of(app, funded.account_id)
    assert statuses == ["settled"] and [c.amount for c in charges] == [-generation.cost]


def test_a_worker_killed_before_the_usage_came_is_settled_at_no_less_than_it(
    app, gateway, make_funded_key
):
    server, upstream, catalog = gateway
    funded = make_funded_key(Decimal("5"))
    # Anthropic's prompt count comes first; the text; then nothing, the worker dies
    # before the message_delta that reports the output's count.
    upstream.script("/claude", Reply("anthropic_stream_text", stall_after_events=8))
    response, generation_id = stream_until(server, funded.key, "claude-sonnet", '"."')
    assert wait_for(
        lambda: (recorded_progress(app, generation_id) or {}).get("completion_tokens", 0) >= 7,
        10,
    ), "the delivered text was never recorded"

    generation = kill_worker_and_wait_for_settlement(app, server, response, generation_id)

    assert generation.status == "interrupted" and generation.estimated
    assert generation.prompt_tokens >= ANTHROPIC_USAGE.prompt_tokens
    assert generation.completion_tokens >= ANTHROPIC_USAGE.completion_tokens
    pricing = catalog.resolve("claude-sonnet").pricing
    assert generation.cost >= cost_of(ANTHROPIC_USAGE, pricing)
    assert usage_of(generation).cached_tokens <= ANTHROPIC_USAGE.cached_tokens


@pytest.mark.parametrize(
    "pauses",
    [
        pytest.param((), id="killed-in-its-first-second"),
        # "The", then 2.5 s (the worker records it), then the rest at once.
        pytest.param(((4, 2.5),), id="killed-just-after-more-text"),
    ],
)
def test_text_delivered_since_the_progress_was_last_recorded_is_never_unbilled(
    app, gateway, make_funded_key, pauses
):
    server, upstream, catalog = gateway
    funded = make_funded_key(Decimal("5"))
    # All the text, then nothing: the worker is killed at once, before its next
    # once-a-second record of what its streams delivered.
    upstream.script("/claude", Reply("anthropic_stream_text", pauses=pauses, stall_after_events=7))
    response, generation_id = stream_until(server, funded.key, "claude-sonnet", '"."')

    generation = kill_worker_and_wait_for_settlement(app, server, response, generation_id)

    # What went out after the last record cannot be known: billed as the most the
    # request could produce, never less than what the caller received.
    assert generation.status == "interrupted" and generation.estimated
    assert generation.completion_tokens >= ANTHROPIC_USAGE.completion_tokens
    assert generation.completion_tokens == 8192  # the model's output limit
    assert generation.prompt_tokens >= ANTHROPIC_USAGE.prompt_tokens
    pricing = catalog.resolve("claude-sonnet").pricing
    assert generation.cost >= cost_of(ANTHROPIC_USAGE, pricing)
    account, statuses, charges = holds_of(app, funded.account_id)
    assert statuses == ["settled"] and [c.amount for c in charges] == [-generation.cost]
