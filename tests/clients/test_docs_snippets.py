"""The examples of README.md, the docs and the dashboard's Quick start, run as written.

A block runs when the line before it is an HTML comment ``<!-- test: NAME -->``; NAME
says here what runs it and what its output must show. Each example runs once: an
example found in two places (the README's and a guide's) is one example. The address
``http://localhost:8000`` becomes the live server's, ``sk-gw-...`` a funded key, which
``GATEWAY_API_KEY`` holds too. The Quick start page's blocks are read from the live
server's page itself, with its own address in them.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from app.accounts import keys
from tests.clients.test_claude_code import claude_command
from tests.clients.test_codex_cli import CODEX
from tests.clients.test_gemini_cli import gemini_command
from tests.contract.conftest import billing_records
from tests.dashboard.conftest import PASSWORD, csrf_token, make_holder

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).resolve().parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLE_BASE_URL = "http://localhost:8000"
EXAMPLE_KEY = "sk-gw-..."
QUICKSTART_BLOCK = re.compile(
    r'<code id="code-([\w-]+)" data-language="(\w+)">(.*?)</code>', re.DOTALL
)
MARKED_BLOCK = re.compile(
    r"^<!-- test: ([\w-]+) -->\n```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL
)
# Where each JavaScript example finds its packages (npm ci, by `make test`).
NODE_FOLDERS = {
    "openai-node": CLIENTS / "node",
    "ai-sdk": CLIENTS / "responses_node",
    "anthropic-typescript": CLIENTS / "messages_node",
}
# What Codex needs to run offline in a fresh home, around the example's own block: a
# top-level key before it, tables after it.
CODEX_BEFORE = "check_for_update_on_startup = false\n"
CODEX_AFTER = """
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


@dataclass(frozen=True)
class Example:
    """One marked block: its name, language, code, and the pages it is on."""

    name: str
    language: str
    code: str
    pages: tuple[str, ...]


def marked_examples() -> dict[str, Example]:
    """Every marked block of the README and docs/, by name, each once."""
    found: dict[str, Example] = {}
    for page in PAGES:
        where = str(page.relative_to(ROOT))
        for name, language, code in MARKED_BLOCK.findall(page.read_text()):
            seen = found.get(name)
            if seen is not None:
                assert (seen.language, seen.code) == (language, code), (
                    f"two examples named {name} differ: {seen.pages[0]} and {where}"
                )
                found[name] = Example(name, language, code, (*seen.pages, where))
            else:
                found[name] = Example(name, language, code, (where,))
    return found


def with_the_server(code: str, server_url: str, key: str) -> str:
    """The example pointed at the live server with a funded key."""
    return code.replace(EXAMPLE_BASE_URL, server_url).replace(EXAMPLE_KEY, key)


def environment(home: Path, key: str, **more: str) -> dict[str, str]:
    """A clean environment: only the key the examples read, a fresh home, and PATH."""
    return {"PATH": os.environ["PATH"], "HOME": str(home), "GATEWAY_API_KEY": key, **more}


def run(command: list[str], env: dict, cwd: Path, timeout: int = 180) -> str:
    """Run an example; return its stdout, failing with its stderr on a non-zero exit."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def run_python(example: Example, code: str, home: Path, key: str) -> str:
    return run([sys.executable, "-c", code], environment(home, key), home)


def run_node(example: Example, code: str, home: Path, key: str) -> str:
    packages = NODE_FOLDERS[example.name] / "node_modules"
    if not packages.is_dir():
        pytest.fail(f"{packages} is missing: run `make test` (npm ci)")
    (home / "node_modules").symlink_to(packages)
    (home / "example.mjs").write_text(code)
    return run(["node", "example.mjs"], environment(home, key), home)


def run_shell(example: Example, code: str, home: Path, key: str) -> str:
    """Run with bash; ``claude`` and ``gemini`` on the PATH are the CLIs npm ci installed."""
    tools = home / "bin"
    tools.mkdir()
    for name, command in (("claude", claude_command), ("gemini", gemini_command)):
        tool = tools / name
        tool.write_text(f'#!/bin/sh\nexec {" ".join(command())} "$@"\n')
        tool.chmod(0o755)
    env = environment(home, key, PATH=f"{tools}:{os.environ['PATH']}")
    return run(["bash", "-euo", "pipefail", "-c", code], env, home)


def run_codex(example: Example, code: str, home: Path, key: str) -> str:
    """Write the block into a fresh CODEX_HOME's config.toml and run ``codex exec``."""
    if not CODEX.exists():
        pytest.fail("Codex CLI is not installed: run `make test` (npm ci in responses_node)")
    codex_home = home / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(CODEX_BEFORE + code + CODEX_AFTER)
    env = environment(home, key, CODEX_HOME=str(codex_home))
    command = [str(CODEX), "exec", "--skip-git-repo-check", "--ephemeral", "Say hello"]
    return run(command, env, home)


RUNNERS: dict[str, Callable[[Example, str, Path, str], str]] = {
    "python": run_python,
    "js": run_node,
    "sh": run_shell,
    "toml": run_codex,
}


def json_documents(output: str) -> list:
    """Decode the JSON documents printed one after another (curl adds no newline)."""
    decoder, documents, position = json.JSONDecoder(), [], 0
    while position < len(output.rstrip()):
        document, position = decoder.raw_decode(output, position)
        documents.append(document)
        while position < len(output) and output[position].isspace():
            position += 1
    return documents


def cost_at_end(line: str) -> Decimal:
    """The cost an example printed last on a line."""
    return Decimal(line.rsplit(" ", 1)[1])


def openai_python_shows(output: str) -> None:
    models, pricing, reply, *chunks, response, followup = output.splitlines()
    assert "'dev-chat'" in models and "'dev-chat-mini'" in models
    assert "'completion': 1.5" in pricing
    assert reply.startswith("Hello") and cost_at_end(reply) > 0
    assert chunks[0].startswith("ChatCompletionChunk(")
    assert "cost={'total_cost':" in chunks[-1]
    assert response.startswith("Hello ") and cost_at_end(response) > 0
    assert followup.startswith("And again ")


def two_costed_answers(output: str) -> None:
    """openai-node: a chat completion and a response, each with its cost."""
    chat, response = output.splitlines()
    assert chat.startswith("Hello") and cost_at_end(chat) > 0
    assert response.startswith("Hello") and cost_at_end(response) > 0


def langchain_shows(output: str) -> None:
    invoked, cost, streamed = output.splitlines()
    assert invoked.startswith("Hello") and Decimal(cost) > 0
    assert streamed.startswith("Hello")


def agents_show(output: str) -> None:
    final, requests = output.splitlines()
    assert final.startswith("Tool result received: Sunny in ")  # the built-in model's way
    assert requests == "2"


def ai_sdk_shows(output: str) -> None:
    generated, streamed = output.splitlines()
    assert generated.startswith("Hello") and cost_at_end(generated) > 0
    assert streamed.startswith("Hello")


def anthropic_python_shows(output: str) -> None:
    message, streamed, counted = output.splitlines()
    assert message.startswith("Hello") and cost_at_end(message) > 0
    assert streamed.startswith("Hello") and cost_at_end(streamed) > 0
    assert int(counted) == 8  # 4 + 1 (Hello) + 3 for the reply, as docs/builtin-model.md counts


def anthropic_typescript_shows(output: str) -> None:
    (message,) = output.splitlines()
    assert message.startswith("Hello") and cost_at_end(message) > 0


def codex_shows(output: str) -> None:
    assert output.startswith("Say hello ")


def claude_code_shows(output: str) -> None:
    assert "Greet the gateway" in output


def google_genai_shows(output: str) -> None:
    reply, streamed, counted, cost = output.splitlines()
    assert reply.startswith("Hello") and int(reply.rsplit(" ", 1)[1]) > 0
    assert streamed.startswith("Hello")
    assert int(counted) > 0 and Decimal(cost) > 0


def gemini_cli_shows(output: str) -> None:
    assert "Greet the gateway" in output


def curl_shows(output: str) -> None:
    completion, response, message, model, credits = json_documents(output)
    assert completion["object"] == "chat.completion"
    assert completion["choices"][0]["message"]["content"].startswith("Hello")
    assert completion["usage"]["cost"]["total_cost"] > 0
    assert response["object"] == "response" and response["usage"]["cost"]["total_cost"] > 0
    assert message["type"] == "message" and message["usage"]["cost"]["total_cost"] > 0
    assert model["id"] == "dev-chat" and model["object"] == "model"
    spent = sum(
        Decimal(str(body["usage"]["cost"]["total_cost"]))
        for body in (completion, response, message)
    )
    assert Decimal(str(credits["data"]["total_usage"])) == spent
    assert Decimal(str(credits["data"]["remaining"])) == Decimal("10") - spent


def embeddings_show(output: str) -> None:
    sizes, same, usage, short = output.splitlines()
    assert sizes == "2 256" and same == "True" and short == "8"
    assert int(usage.split()[0]) == 6 and cost_at_end(usage) > 0


def gemini_embeddings_show(output: str) -> None:
    sizes, tokens, one = output.splitlines()
    assert sizes == "2 8" and int(tokens) == 6
    assert one.split()[0] == "256" and cost_at_end(one) > 0


def langchain_embeddings_show(output: str) -> None:
    assert output.splitlines() == ["3 256", "True"]


CHECKS: dict[str, Callable[[str], None]] = {
    "openai-python": openai_python_shows,
    "openai-node": two_costed_answers,
    "langchain": langchain_shows,
    "openai-agents": agents_show,
    "ai-sdk": ai_sdk_shows,
    "anthropic-python": anthropic_python_shows,
    "anthropic-typescript": anthropic_typescript_shows,
    "codex-cli": codex_shows,
    "claude-code": claude_code_shows,
    "google-genai": google_genai_shows,
    "gemini-cli": gemini_cli_shows,
    "curl": curl_shows,
    "embeddings-python": embeddings_show,
    "embeddings-langchain": langchain_embeddings_show,
    "gemini-embeddings": gemini_embeddings_show,
}
EXAMPLES = marked_examples()


def test_every_marked_example_has_a_check_and_every_check_an_example():
    assert set(EXAMPLES) == set(CHECKS)
    assert all(example.language in RUNNERS for example in EXAMPLES.values())


def test_the_readme_shows_a_client_of_each_api():
    on_the_readme = {name for name, e in EXAMPLES.items() if "README.md" in e.pages}
    assert {
        "openai-python",
        "curl",
        "anthropic-python",
        "codex-cli",
        "claude-code",
    } <= on_the_readme


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_the_example_runs_as_written(name, app, live_server, funded_key, tmp_path):
    example = EXAMPLES[name]
    assert EXAMPLE_BASE_URL in example.code, f"{name} does not name the example address"
    code = with_the_server(example.code, live_server.url, funded_key.key)

    output = RUNNERS[example.language](example, code, tmp_path, funded_key.key)

    CHECKS[name](output)
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    assert generations and account.reserved == 0
    assert sum(-charge.amount for charge in charges) == sum(g.cost for g in generations)


@pytest.fixture(scope="module")
def quickstart_page(app, live_server) -> tuple[dict[str, Example], int, str]:
    """The live server's Quick start blocks, as a signed-in holder reads them; their key."""
    account_id, email = make_holder(app, credits=Decimal("10"))
    with app.app_context():
        key = keys.create_key(account_id=account_id, name="quick start").value
    browser = requests.Session()
    token = csrf_token(browser.get(f"{live_server.url}/signin", timeout=30).text)
    form = {"csrf_token": token, "email": email, "password": PASSWORD}
    browser.post(f"{live_server.url}/signin", data=form, timeout=30).raise_for_status()
    page = browser.get(f"{live_server.url}/quickstart", timeout=30)
    assert page.status_code == 200 and page.url.endswith("/quickstart")
    blocks = {
        name: Example(name, language, html.unescape(code), ("/quickstart",))
        for name, language, code in QUICKSTART_BLOCK.findall(page.text)
    }
    return blocks, account_id, key


@pytest.mark.parametrize(
    "name",
    ["curl", "openai-python", "openai-node", "anthropic-python", "anthropic-typescript",
     "codex-cli", "claude-code"],
)  # fmt: skip
def test_the_quick_start_block_runs_as_shown(name, app, live_server, quickstart_page, tmp_path):
    blocks, account_id, key = quickstart_page
    block = blocks[name]
    assert live_server.url in block.code  # the page's own address, nothing to replace
    code = block.code
    if name == "claude-code":  # the block starts a session; a test asks one question
        code = code.rstrip() + ' -p "Greet the gateway"\n'
    _, before, _, _ = billing_records(app, account_id)

    output = RUNNERS[block.language](block, code, tmp_path, key)

    assert output.strip()
    account, generations, charges, _ = billing_records(app, account_id)
    assert len(generations) > len(before) and account.reserved == 0
    assert sum(-charge.amount for charge in charges) == sum(g.cost for g in generations)
