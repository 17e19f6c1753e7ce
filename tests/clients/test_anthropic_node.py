"""The Anthropic SDK for TypeScript (npm ``@anthropic-ai/sdk``) against the Messages door.

``make test`` installs the pinned package (tests/clients/messages_node/package-lock.json)
with npm ci.
"""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.contract.conftest import billing_records

NODE_DIR = Path(__file__).resolve().parent / "messages_node"


def run_node_script(name: str, base_url: str, key: str) -> dict:
    """Run a script of tests/clients/messages_node and return the JSON it printed."""
    if not (NODE_DIR / "node_modules" / "@anthropic-ai" / "sdk").is_dir():
        pytest.fail("@anthropic-ai/sdk is not installed: run `make test` (npm ci in messages_node)")
    completed = subprocess.run(
        ["node", name],
        cwd=NODE_DIR,
        env={**os.environ, "GATEWAY_BASE_URL": base_url, "GATEWAY_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_the_typescript_sdk_creates_streams_and_reads_the_cost(app, live_server, funded_key):
    result = run_node_script("anthropic_sdk.mjs", live_server.url, funded_key.key)

    create = result["create"]
    assert create["id"].startswith("msg_") and create["stopReason"] == "end_turn"
    assert create["content"][0]["text"].startswith("Hello from node")
    stream = result["stream"]
    assert stream["events"][0] == "message_start" and stream["events"][-1] == "message_stop"
    assert [block["type"] for block in stream["final"]["content"]] == ["thinking", "text"]
    assert stream["final"]["content"][0]["signature"]
    assert stream["text"] == stream["final"]["content"][1]["text"]
    assert stream["text"].startswith("Hello from node")
    assert stream["final"]["usage"]["output_tokens"] == stream["deltaUsage"]["output_tokens"]
    tool = result["streamedTool"]
    assert tool["stopReason"] == "tool_use"
    assert tool["content"][0]["name"] == "get_weather"
    assert set(tool["content"][0]["input"]) == {"city", "unit"}
    assert result["missingModel"] == {
        "name": "NotFoundError",
        "status": 404,
        "type": "not_found_error",
    }
    account, generations, charges, _ = billing_records(app, funded_key.account_id)
    reported = [create["usage"]["cost"]["total_cost"], stream["deltaUsage"]["cost"]["total_cost"]]
    assert len(generations) == 3 and {g.api for g in generations} == {"messages"}
    by_id = {generation.id: generation.cost for generation in generations}
    assert Decimal(str(reported[0])) == by_id[create["id"]]
    assert Decimal(str(reported[1])) in by_id.values()
    assert account.balance == Decimal(10) - sum(by_id.values())
    assert -sum(charge.amount for charge in charges) == sum(by_id.values())
