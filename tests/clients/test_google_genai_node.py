"""Google's Gen AI SDK for JavaScript (npm ``@google/genai``) against the Gemini door.

``make test`` installs the pinned package (tests/clients/gemini_node/package-lock.json)
with npm ci; the script sets only the base URL and the key.
"""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.contract.conftest import billing_records

NODE_DIR = Path(__file__).resolve().parent / "gemini_node"


def run_node_script(name: str, base_url: str, key: str) -> dict:
    """Run a script of tests/clients/gemini_node and return the JSON it printed."""
    if not (NODE_DIR / "node_modules" / "@google" / "genai").is_dir():
        pytest.fail("@google/genai is not installed: run `make test` (npm ci in gemini_node)")
    environment = {"PATH": os.environ["PATH"], "GATEWAY_BASE_URL": base_url, "GATEWAY_API_KEY": key}
    completed = subprocess.run(
        ["node", name],
        cwd=NODE_DIR,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_the_javascript_sdk_generates_streams_and_is_refused_in_googles_terms(
    app, live_server, funded_key
):
    result = run_node_script("genai_sdk.mjs", live_server.url, funded_key.key)

    generate, stream = result["generate"], result["stream"]
    assert generate["text"].startswith("Hello from node")
    assert generate["finishReason"] == stream["finishReason"] == "STOP"
    assert stream["count"] > 2 and stream["text"].startswith("Hello from node")
    assert result["missing"]["status"] == 404 and "NOT_FOUND" in result["missing"]["message"]
    account, generations, charges, _ = billing_records(app, funded_key.account_id)
    by_id = {generation.id: generation for generation in generations}
    assert set(by_id) == {generate["responseId"], *stream["responseIds"]}
    assert not by_id[generate["responseId"]].streamed and by_id[stream["responseIds"][0]].streamed
    assert account.balance == Decimal("10") - sum(g.cost for g in generations)
    for usage, generation_id in ((generate["usage"], generate["responseId"]),
                                 (stream["usage"], stream["responseIds"][0])):  # fmt: skip
        generation = by_id[generation_id]
        assert Decimal(str(usage["cost"]["totalCost"])) == generation.cost > 0
        assert usage["promptTokenCount"] == generation.prompt_tokens
