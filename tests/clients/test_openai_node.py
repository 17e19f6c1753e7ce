"""openai-node (the npm package ``openai``) against the gateway, from a node script.

``make test`` installs the pinned package (tests/clients/node/package-lock.json) with npm ci.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent / "node"


def run_node_script(name: str, base_url: str, key: str) -> dict:
    """Run a script of tests/clients/node and return the JSON it printed."""
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        pytest.fail("openai-node is not installed: run `make test` (npm ci in tests/clients/node)")
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


def test_openai_node_streams_calls_tools_and_reads_the_cost(base_url, funded_key):
    result = run_node_script("stream_and_tools.mjs", base_url, funded_key.key)

    stream = result["stream"]
    assert stream["text"].startswith("Hello from node")
    assert stream["usage"]["cost"]["total_cost"] > 0
    assert stream["usage"]["total_tokens"] == (
        stream["usage"]["prompt_tokens"] + stream["usage"]["completion_tokens"]
    )
    tools = result["tools"]
    assert tools["finishReason"] == "tool_calls"
    assert tools["call"]["name"] == "get_weather"
    assert tools["call"]["arguments"]["unit"] in {"celsius", "fahrenheit"}
    assert tools["answer"].startswith('Tool result received: {"temperature": 18}')
    assert all(cost > 0 for cost in tools["costs"])
    assert result["streamedTool"]["name"] == "get_weather"
    assert set(result["streamedTool"]["arguments"]) >= {"city", "unit"}
    assert result["model"] == "dev-chat"
    assert result["missingModel"] == {
        "status": 404,
        "code": "model_not_found",
        "type": "invalid_request_error",
    }
