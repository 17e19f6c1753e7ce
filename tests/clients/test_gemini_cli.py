"""Gemini CLI (npm ``@google/gemini-cli``) pointed at the gateway, as the guide says to.

Two variables send it here: GOOGLE_GEMINI_BASE_URL (the gateway's root, without a
version) and GEMINI_API_KEY (a gateway key, sent as ``x-goog-api-key``). From the base
URL alone the CLI would pick its "gateway" sign-in, which it then refuses: its
``settings.json`` selects API-key auth. The same file turns off its usage statistics,
telemetry and update checks, so that it calls nothing but the gateway; HOME is a fresh
folder, where it keeps that file. ``make test`` installs it with npm ci
(tests/clients/gemini_node).
"""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.contract.conftest import billing_records

PACKAGE = Path(__file__).resolve().parent / "gemini_node/node_modules/@google/gemini-cli"
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}


def gemini_command() -> list[str]:
    """Return the command that runs Gemini CLI, installed by npm ci."""
    script = PACKAGE / "bundle" / "gemini.js"
    if not script.exists():
        pytest.fail("Gemini CLI is not installed: run `make test` (npm ci in gemini_node)")
    return ["node", str(script)]


def run_gemini(
    server_url: str, key: str, home: Path, *arguments: str
) -> subprocess.CompletedProcess:
    """Run ``gemini -p`` against the gateway, as a user with only the guide's settings would."""
    work = home.parent / "work"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "GOOGLE_GEMINI_BASE_URL": server_url,
        "GEMINI_API_KEY": key,
        # A headless run refuses a folder the user never trusted.
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    return subprocess.run(
        [*gemini_command(), *arguments],
        cwd=work,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_gemini_cli_answers_through_the_gateway_and_is_charged_what_it_records(
    app, live_server, funded_key, tmp_path
):
    done = run_gemini(
        live_server.url,
        funded_key.key,
        tmp_path / "home",
        "--model",
        "dev-chat",
        "--output-format",
        "json",
        "-p",
        "Greet the gateway",
    )

    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert "Greet the gateway" in answer["response"]
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert generations and all(generation.api == "gemini" for generation in generations)
    assert all(generation.streamed for generation in generations)
    assert account.reserved == 0 and all(hold.status == "settled" for hold in holds)
    assert account.balance == Decimal("10") - sum(g.cost for g in generations) > 0


def test_a_tool_call_round_trip_runs_the_clis_tool_and_answers(
    app, live_server, funded_key, tmp_path
):
    done = run_gemini(
        live_server.url,
        funded_key.key,
        tmp_path / "home",
        "--model",
        "dev-chat",
        "--output-format",
        "json",
        "-p",
        "Use list_directory on this folder",
    )

    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout)["stats"]
    assert stats["tools"]["byName"]["list_directory"]["count"] == 1
    _, generations, _, _ = billing_records(app, funded_key.account_id)
    assert len(generations) == 2 and {g.finish_reason for g in generations} >= {"tool_calls"}


def test_no_credit_is_shown_at_once_in_the_gateways_words(
    app, live_server, make_funded_key, tmp_path
):
    poor = make_funded_key(Decimal("0"))
    done = run_gemini(
        live_server.url, poor.key, tmp_path / "home", "--model", "dev-chat", "-p", "Hello"
    )

    assert done.returncode != 0
    assert "Insufficient credits" in done.stderr
    _, generations, _, _ = billing_records(app, poor.account_id)
    assert generations == []
