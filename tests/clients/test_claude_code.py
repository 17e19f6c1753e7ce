"""Claude Code (npm ``@anthropic-ai/claude-code``) pointed at the gateway, as its docs say to.

Two variables send it here: ANTHROPIC_BASE_URL (without /v1) and ANTHROPIC_AUTH_TOKEN (a
gateway key, sent as a bearer). CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 keeps it from
calling anywhere else, and HOME is a fresh folder: it writes its settings there. It asks
for 32000 output tokens, adaptive thinking and a high effort, sends a system turn naming
its tools inside ``messages``, and streams; ``make test`` installs it with npm ci
(tests/clients/messages_node).
"""

from __future__ import annotations

import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from tests.contract.conftest import billing_records

PACKAGE = Path(__file__).resolve().parent / "messages_node/node_modules/@anthropic-ai/claude-code"
# npm's postinstall copies the platform's native binary over this stub.
NATIVE_BINARY_BYTES = 1_000_000


def claude_command() -> list[str]:
    """Return the command that runs Claude Code, installed by npm ci.

    Where npm ran no install scripts (as npm may be told to), the stub stays, and
    the package's wrapper finds and runs the platform's binary instead.
    """
    binary = PACKAGE / "bin" / "claude.exe"
    if not binary.exists():
        pytest.fail("Claude Code is not installed: run `make test` (npm ci in messages_node)")
    if binary.stat().st_size > NATIVE_BINARY_BYTES:
        return [str(binary)]
    return ["node", str(PACKAGE / "cli-wrapper.cjs")]


def run_claude(
    server_url: str, key: str, home: Path, *arguments: str
) -> subprocess.CompletedProcess:
    """Run ``claude -p`` against the gateway, as a user with an empty home would.

    It runs in an empty folder beside ``home``: Claude Code sends its working tree's git
    status along.
    """
    work = home.parent / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": server_url,
        "ANTHROPIC_AUTH_TOKEN": key,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    return subprocess.run(
        [*claude_command(), "-p", *arguments],
        cwd=work,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_claude_code_answers_through_the_gateway_and_is_charged_what_it_records(
    app, live_server, funded_key, tmp_path
):
    done = run_claude(
        live_server.url,
        funded_key.key,
        tmp_path / "home",
        "Greet the gateway",
        "--model",
        "dev-chat",
    )

    assert done.returncode == 0, done.stderr
    assert "Greet the gateway" in done.stdout
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    # One turn, one streamed generation: the system turn naming its tools made no call.
    (generation,) = generations
    assert (generation.api, generation.model, generation.streamed) == ("messages", "dev-chat", True)
    assert generation.status == "completed" and generation.finish_reason == "stop"
    assert generation.reasoning_tokens > 0  # its adaptive thinking, at a high effort
    assert generation.cost > 0 and [charge.amount for charge in charges] == [-generation.cost]
    assert account.balance == Decimal(10) - generation.cost and account.reserved == 0
    assert [hold.status for hold in holds] == ["settled"]


def test_claude_code_names_a_model_the_gateway_does_not_serve(
    app, live_server, funded_key, tmp_path
):
    done = run_claude(
        live_server.url, funded_key.key, tmp_path / "home", "Hello", "--model", "claude-opus-5-5"
    )

    assert done.returncode == 1
    assert "claude-opus-5-5" in done.stdout + done.stderr
    assert billing_records(app, funded_key.account_id)[1] == []
