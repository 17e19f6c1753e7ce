"""After a mixed run on the real server, every hourly rollup is the sum of its generations."""

from __future__ import annotations

import json
import os
import signal
from decimal import Decimal

import requests
from sqlalchemy import select

from app.accounts.keys import create_key, delete_key
from app.credits.models import NO_KEY, UsageRollup
from app.credits.settlement import hour_of
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import TEST_CATALOG, running_server
from tests.contract.conftest import open_slow_stream
from tests.contract.test_holds import child_pids, recorded_progress, wait_for
from tests.upstream_server import ReplayServer, Reply

# The test catalog, and a model whose upstream reports more usage than its hold covers.
OVERRUN = """
[upstreams.own]
kind = "openai"
base_url = "{url}/own/v1"
retries = 0

[[models]]
id = "story"
max_output_tokens = 4096
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [{{ upstream = "own", model = "Qwen/Qwen3-8B" }}]
"""
SUMS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
MONEY = ("cost", "shortfall")
HELLO = [{"role": "user", "content": "Hello"}]


def post(url, key, body, **kwargs):
    headers = {"Authorization": f"Bearer {key}"}
    return requests.post(
        f"{url}/v1/chat/completions", headers=headers, json=body, timeout=30, **kwargs
    )


def rollups_of(app, account_id):
    with app.app_context():
        rows = db.session.scalars(
            select(UsageRollup).where(UsageRollup.account_id == account_id)
        ).all()
        db.session.commit()
        return {
            (row.api_key_id, row.model, row.hour): tuple(getattr(row, n) for n in SUMS + MONEY)
            for row in rows
        }


def generations_summed(app, account_id):
    """The generations' sums per key, model and hour, added up here in Python; their keys."""
    with app.app_context():
        generations = db.session.scalars(
            select(Generation).where(Generation.account_id == account_id)
        ).all()
        totals: dict[tuple, list] = {}
        for g in generations:
            key = (g.api_key_id or NO_KEY, g.model, hour_of(g.created_at))
            row = totals.setdefault(key, [0] * len(SUMS) + [Decimal(0)] * len(MONEY))
            values = (1, g.prompt_tokens, g.cached_tokens, g.completion_tokens, g.reasoning_tokens)
            for index, value in enumerate(values + (g.cost, g.shortfall)):
                row[index] += value
        keys = {g.api_key_id for g in generations}
        db.session.commit()
    return {key: tuple(values) for key, values in totals.items()}, keys


def statuses_of(app, account_id):
    with app.app_context():
        found = db.session.execute(
            select(Generation.status, Generation.shortfall).where(
                Generation.account_id == account_id
            )
        ).all()
        db.session.commit()
        return found


def test_rollups_equal_the_generations_after_a_mixed_run(
    app, database_url, tmp_path, make_funded_key, runner
):
    upstream = ReplayServer()
    catalog = tmp_path / "models.toml"
    catalog.write_text(open(TEST_CATALOG).read() + OVERRUN.format(url=upstream.url))
    funded = make_funded_key(Decimal("0.06"))
    with app.app_context():
        streamer = create_key(account_id=funded.account_id, name="deleted mid-stream")
        gone = create_key(account_id=funded.account_id, name="deleted after")
    try:
        with running_server(
            database_url, tmp_path, catalog=str(catalog), HOLD_TTL_SECONDS="4"
        ) as server:
            run_mixed_requests(app, server, funded, streamer, gone, upstream)
    finally:
        upstream.close()

    summed, keys = generations_summed(app, funded.account_id)
    assert rollups_of(app, funded.account_id) == summed
    statuses = [status for status, _ in statuses_of(app, funded.account_id)]
    assert {"completed", "interrupted"} <= set(statuses)
    assert any(shortfall > 0 for _, shortfall in statuses_of(app, funded.account_id))
    assert {funded.key_id, streamer.id, gone.id} <= keys
    audit = runner.invoke(args=["ledger", "audit", "--full", "--account", str(funded.account_id)])
    assert audit.exit_code == 0, audit.output
    assert "mismatch:" not in audit.output


def run_mixed_requests(app, server, funded, streamer, gone, upstream):
    """Whole answers and streams, keys deleted, a worker killed mid-stream, a shortfall."""
    for model in ("dev-chat", "dev-chat-mini"):
        assert post(server.url, funded.key, {"model": model, "messages": HELLO}).ok
    streamed = post(
        server.url, gone.value, {"model": "dev-chat", "messages": HELLO, "stream": True}
    )
    assert streamed.ok and streamed.text.rstrip().endswith("data: [DONE]")
    with app.app_context():
        delete_key(gone.id)

    # A key deleted while its stream runs: the stream settles under it all the same.
    response = open_slow_stream(server.url, streamer.value, words=5)
    lines = response.iter_lines()
    assert next(lines).startswith(b"data: ")
    with app.app_context():
        delete_key(streamer.id)
    assert b"data: [DONE]" in b"".join(lines)

    kill_a_worker_mid_stream(app, server, funded)

    upstream.reset()
    upstream.script("/own", Reply("openai_chat_overrun"))
    overrun = post(server.url, funded.key, {"model": "story", "messages": HELLO, "max_tokens": 1})
    assert overrun.ok, overrun.text


def kill_a_worker_mid_stream(app, server, funded):
    """Kill the worker serving a stream once its progress is recorded; wait for its charge."""
    response = open_slow_stream(server.url, funded.key)
    events = (json.loads(line[6:]) for line in response.iter_lines() if line)
    received = [next(events) for _ in range(10)]
    generation_id = received[0]["id"]
    assert wait_for(lambda: recorded_progress(app, generation_id), 10)
    (worker,) = child_pids(server.process.pid)
    os.kill(worker, signal.SIGKILL)
    response.close()

    def interrupted():
        with app.app_context():
            found = db.session.get(Generation, generation_id)
            db.session.commit()
            return found

    assert wait_for(interrupted, 30), "the killed stream's hold was never settled"
