"""Codex CLI (npm @openai/codex) through the gateway: a Responses API model provider.

``make test`` installs the pinned CLI (tests/clients/responses_node, npm ci). Each run is
offline and self-contained, as in CI (root, a fresh container): HOME and CODEX_HOME in a
temporary folder, analytics, telemetry and plugin sync off, outside any git repository
(--skip-git-repo-check), stdin /dev/null (Codex otherwise waits for it to close), no
retries. The built-in model answers text only, so the sandbox is never used.
"""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.contract.conftest import billing_records

CODEX = Path(__file__).resolve().parent / "responses_node" / "node_modules" / ".bin" / "codex"
CONFIG = """
model = "dev-chat"
model_provider = "gateway"
check_for_update_on_startup = false

[model_providers.gateway]
name = "credit gateway"
base_url = "{base_url}"
env_key = "GATEWAY_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"

[features]
plugins = false
remote_plugin = false
apps = false
"""


def run_codex(tmp_path: Path, base_url: str, key: str, *arguments: str) -> str:
    """Run ``codex exec`` in a home of its own; return its stdout, failing on a non-zero exit."""
    if not CODEX.exists():
        pytest.fail(
            "Codex CLI is not installed: run `make test` (npm ci in tests/clients/responses_node)"
        )
    home, codex_home, work = (tmp_path / name for name in ("home", "codex", "work"))
    for folder in (home, codex_home, work):
        folder.mkdir(exist_ok=True)
    (codex_home / "config.toml").write_text(CONFIG.format(base_url=base_url))
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "CODEX_HOME": str(codex_home),
        "GATEWAY_API_KEY": key,
    }
    done = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--ephemeral", *arguments],
        cwd=work,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_codex_exec_answers_and_the_account_pays_its_generations(
    app, tmp_path, base_url, funded_key
):
    printed = run_codex(tmp_path, base_url, funded_key.key, "Say hello")

    assert printed.startswith("Say hello ")
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    (generation,) = generations
    assert (generation.api, generation.model, generation.streamed) == (
        "responses",
        "dev-chat",
        True,
    )
    assert generation.status == "completed" and generation.cost > 0
    assert [-charge.amount for charge in charges] == [generation.cost]
    assert account.balance == Decimal("10") - generation.cost
    assert account.reserved == 0 and [hold.status for hold in holds] == ["settled"]


def test_codex_reports_the_tokens_its_generation_records(app, tmp_path, base_url, funded_key):
    lines = run_codex(tmp_path, base_url, funded_key.key, "--json", "Say hello").splitlines()

    events = [json.loads(line) for line in lines if line.startswith("{")]
    (message,) = [
        e["item"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"
    ]
    assert message["text"].startswith("Say hello ")
    (usage,) = [event["usage"] for event in events if event["type"] == "turn.completed"]
    _, (generation,), _, _ = billing_records(app, funded_key.account_id)
    assert (usage["input_tokens"], usage["output_tokens"]) == (
        generation.prompt_tokens,
        generation.completion_tokens,
    )
