"""The Vercel AI SDK (npm ai + @ai-sdk/openai, whose openai(model) speaks the Responses API).

``make test`` installs the pinned packages (tests/clients/responses_node, npm ci).
"""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.contract.conftest import billing_records

NODE_DIR = Path(__file__).resolve().parent / "responses_node"


def run_script(name: str, base_url: str, key: str) -> dict:
    """Run a script of tests/clients/responses_node and return the JSON it printed."""
    if not (NODE_DIR / "node_modules" / "ai").is_dir():
        pytest.fail(
            "The AI SDK is not installed: run `make test` (npm ci in tests/clients/responses_node)"
        )
    done = subprocess.run(
        ["node", name],
        cwd=NODE_DIR,
        env={**os.environ, "GATEWAY_BASE_URL": base_url, "GATEWAY_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_generate_text_and_stream_text_call_a_tool_and_answer(app, base_url, funded_key):
    result = run_script("ai_sdk.mjs", base_url, funded_key.key)

    for run in (result["generate"], result["stream"]):
        assert run["text"] == "Tool result received: Sunny in Weather"
        assert (run["finishReason"], run["steps"]) == ("stop", 2)
    assert result["stream"]["errors"] == []
    assert result["calls"] == ["Weather", "Weather"]
    plain = result["plain"]
    assert plain["text"].startswith("Hello there ") and plain["finishReason"] == "stop"
    _, generations, charges, _ = billing_records(app, funded_key.account_id)
    by_id = {generation.id: generation for generation in generations}
    for run in (result["generate"], result["stream"]):
        steps = [by_id[response_id] for response_id in run["responseIds"]]
        assert run["usage"]["inputTokens"] == sum(g.prompt_tokens for g in steps)
        assert run["usage"]["outputTokens"] == sum(g.completion_tokens for g in steps)
    assert {g.api for g in generations} == {"responses"} and len(generations) == 5
    raw_cost = Decimal(str(plain["usage"]["raw"]["cost"]["total_cost"]))
    assert raw_cost in {g.cost for g in generations}
    assert sum(-charge.amount for charge in charges) == sum(g.cost for g in generations)
