"""Gemini CLI (npm ``@google/gemini-cli``) pointed at the gateway, as the guide says to.

Two variables send it here: GOOGLE_GEMINI_BASE_URL (the gateway's root, without a
version) and GEMINI_API_KEY (a gateway key, sent as ``x-goog-api-key``). From the base
URL alone the CLI would pick its "gateway" sign-in, which it then refuses: its
``settings.json`` selects API-key auth. The same file turns off its usage statistics,
telemetry and update checks, so that it calls nothing but the gateway; HOME is a fresh
folder, where it keeps that file. ``make test`` installs it with npm ci
(tests/clients/gemini_node).

On the built-in model the gateway answers itself; on a Gemini upstream it calls the
replay server, which plays Google's answers (tests/fixtures/transcripts/gemini_*) and
records what the gateway sent it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import pytest

from app.catalog.pricing import cost_of
from app.encoding import loads
from app.providers.gemini import usage_from
from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import ReplayServer, Reply, load_transcript, split_events

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


GOOGLE_KEY = "AIzaSy-test-only-gemini-key-0000000000"
# What Gemini CLI 0.61.0 asks for without --model (its "auto" model): every prompt first
# goes to its router, the small model, whose score picks the flash or the pro model; the
# pro model without custom tools when the router's answer is unusable.
ROUTER_MODEL = "gemini-3.5-flash-lite"
MAIN_MODELS = ["gemini-3.8-flash", "gemini-3.1-pro-preview-customtools", "gemini-3.1-pro-preview"]
CATALOG = f"""
[upstreams.google]
kind = "gemini"
base_url = "{{url}}/google"
api_key_env = "GEMINI_API_KEY"
retries = 0

[[models]]
id = "gemini-gw"
aliases = {json.dumps(MAIN_MODELS)}
context_length = 1048576
max_output_tokens = 8192
capabilities = ["tools", "json_schema", "reasoning", "vision"]
pricing = {{{{ prompt = 0.30, completion = 2.50, cached_read = 0.03 }}}}
routes = [{{{{ upstream = "google", model = "gemini-2.5-flash", api = "gemini" }}}}]

[[models]]
id = "gemini-gw-lite"
aliases = ["{ROUTER_MODEL}"]
context_length = 1048576
max_output_tokens = 8192
capabilities = ["tools", "json_schema", "reasoning"]
pricing = {{{{ prompt = 0.10, completion = 0.40, cached_read = 0.01 }}}}
routes = [{{{{ upstream = "google", model = "gemini-2.5-flash-lite", api = "gemini" }}}}]

[[models]]
id = "gemini-translated"
context_length = 1048576
max_output_tokens = 8192
capabilities = ["tools", "json_schema", "reasoning", "vision"]
pricing = {{{{ prompt = 0.30, completion = 2.50, cached_read = 0.03 }}}}
routes = [{{{{ upstream = "google", model = "gemini-2.5-flash" }}}}]
"""
# The signature on the list_directory call of gemini_stream_cli_list_directory.
SIGNATURE = "CiQB0e2Kb3Rlc3Qtb25seS1jbGktbGlzdC1zaWduYXR1cmUtbm90LXJlYWw="
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "clients" / "gemini.md"
FLASH = "/google/v1beta/models/gemini-2.5-flash:"
FLASH_LITE = "/google/v1beta/models/gemini-2.5-flash-lite:"


@pytest.fixture(scope="module")
def google() -> ReplayServer:
    """The replay server playing Google's Generative Language API."""
    server = ReplayServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def gemini_gateway(app, database_url, google, tmp_path_factory):
    """A gateway whose catalog routes Gemini models to the replay server."""
    folder = tmp_path_factory.mktemp("gemini-cli-upstream")
    with gateway_serving(
        CATALOG.format(url=google.url), database_url, folder, GEMINI_API_KEY=GOOGLE_KEY
    ) as gateway:
        yield gateway


@pytest.fixture
def scripted(google):
    """Every test scripts Google's replies, and uses all of them."""
    google.reset()
    yield google
    assert google.unused_replies() == {}


def reported_usage(transcript: str) -> dict:
    """Return the usageMetadata a transcript reports: a stream's last event carries it whole."""
    body = load_transcript(transcript)[1]
    if body.startswith(b"data:"):
        body = split_events(body)[-1].removeprefix(b"data:")
    return loads(body)["usageMetadata"]


def assert_charged_what_google_reported(
    app, gateway, funded_key, answered: list[tuple[str, str]]
) -> list:
    """Each (model, transcript) in ``answered`` billed once, at its price of the usage reported."""
    account, generations, charges, holds = billing_records(app, funded_key.account_id)
    expected = [
        (
            model,
            cost_of(usage_from(reported_usage(transcript)), gateway.catalog.resolve(model).pricing),
        )
        for model, transcript in answered
    ]
    assert sorted((g.model, g.cost) for g in generations) == sorted(expected)
    assert all(g.api == "gemini" and g.cost > 0 for g in generations)
    assert sorted(c.amount for c in charges) == sorted(-g.cost for g in generations)
    assert account.reserved == 0 and all(hold.status == "settled" for hold in holds)
    assert account.balance == Decimal("10") - sum(g.cost for g in generations)
    return generations


def test_gemini_cli_on_a_gemini_upstream_is_passed_through_and_charged_googles_usage(
    app, gemini_gateway, funded_key, scripted, tmp_path
):
    scripted.script(FLASH, Reply("gemini_stream"))

    done = run_gemini(
        gemini_gateway.url,
        funded_key.key,
        tmp_path / "home",
        "--model",
        "gemini-gw",
        "--output-format",
        "json",
        "-p",
        "Which is greater, 9.8 or 9.11?",
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["response"].strip() == "9.8 is greater than 9.11."
    (exchange,) = scripted.exchanges
    assert exchange.path == FLASH + "streamGenerateContent?alt=sse"
    assert exchange.headers["x-goog-api-key"] == GOOGLE_KEY
    sent = exchange.json
    assert sent["contents"][-1]["parts"][-1] == {"text": "Which is greater, 9.8 or 9.11?"}
    assert sent["tools"][0]["functionDeclarations"], "the CLI's tools reach Google as sent"
    (generation,) = assert_charged_what_google_reported(
        app, gemini_gateway, funded_key, [("gemini-gw", "gemini_stream")]
    )
    assert generation.streamed


def test_a_tool_call_round_trip_on_a_gemini_upstream_sends_the_signature_back_as_it_came(
    app, gemini_gateway, funded_key, scripted, tmp_path
):
    scripted.script(FLASH, Reply("gemini_stream_cli_list_directory"), Reply("gemini_stream"))

    done = run_gemini(
        gemini_gateway.url,
        funded_key.key,
        tmp_path / "home",
        "--model",
        "gemini-gw",
        "--output-format",
        "json",
        "-p",
        "Use list_directory on this folder",
    )

    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["stats"]["tools"]["byName"]["list_directory"]["count"] == 1
    assert answer["response"].strip() == "9.8 is greater than 9.11."
    _, second = scripted.exchanges
    (call,) = [
        part
        for content in second.json["contents"]
        for part in content["parts"]
        if "functionCall" in part
    ]
    # The CLI adds its own id to the call; the signature goes back as Google wrote it.
    assert call["functionCall"]["name"] == "list_directory"
    assert call["functionCall"]["args"] == {"dir_path": "."}
    assert call["thoughtSignature"] == SIGNATURE and SIGNATURE.encode() in second.body
    responses = [
        part["functionResponse"]["name"]
        for content in second.json["contents"]
        for part in content["parts"]
        if "functionResponse" in part
    ]
    assert responses == ["list_directory"]
    assert_charged_what_google_reported(
        app,
        gemini_gateway,
        funded_key,
        [("gemini-gw", "gemini_stream_cli_list_directory"), ("gemini-gw", "gemini_stream")],
    )


def test_gemini_cli_on_a_translated_gemini_route_is_answered_and_charged(
    app, gemini_gateway, funded_key, scripted, tmp_path
):
    scripted.script(FLASH, Reply("gemini_stream"))

    done = run_gemini(
        gemini_gateway.url,
        funded_key.key,
        tmp_path / "home",
        "--model",
        "gemini-translated",
        "--output-format",
        "json",
        "-p",
        "Which is greater, 9.8 or 9.11?",
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["response"].strip() == "9.8 is greater than 9.11."
    (exchange,) = scripted.exchanges
    assert exchange.path == FLASH + "streamGenerateContent?alt=sse"
    sent = exchange.json
    assert sent["contents"][-1]["parts"][-1]["text"].endswith("Which is greater, 9.8 or 9.11?")
    assert sent["tools"][0]["functionDeclarations"]
    assert_charged_what_google_reported(
        app, gemini_gateway, funded_key, [("gemini-translated", "gemini_stream")]
    )


def names_asked(gateway, account_id: int, count: int) -> list[tuple[str, str]]:
    """Return, from the gateway's access log, each path an account called and its model.

    A stream's line is written once its body is closed, which may come after the CLI has
    read the last event and exited: wait for ``count`` lines (a few seconds at most).
    """
    deadline = time.monotonic() + 10
    while True:
        lines = re.finditer(
            r'"POST /v1beta/models/([^"]+)" .* account_id=(\d+) .* model=(\S+)',
            gateway.log.read_text(),
        )
        asked = [(line[1], line[3]) for line in lines if int(line[2]) == account_id]
        if len(asked) >= count or time.monotonic() > deadline:
            return asked
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("router_says", "answering_name"),
    [
        ("gemini_generate_router_simple", MAIN_MODELS[0]),
        ("gemini_generate_router_hard", MAIN_MODELS[1]),
    ],
)
def test_without_model_the_clis_default_names_are_answered_by_catalog_aliases(
    app, gemini_gateway, funded_key, scripted, tmp_path, router_says, answering_name
):
    # The router scores the prompt: 10 makes the CLI ask for its flash model, 90 its pro.
    scripted.script(FLASH_LITE, Reply(router_says))
    scripted.script(FLASH, Reply("gemini_stream"))

    done = run_gemini(
        gemini_gateway.url,
        funded_key.key,
        tmp_path / "home",
        "--output-format",
        "json",
        "-p",
        "Which is greater, 9.8 or 9.11?",
    )

    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["response"].strip() == "9.8 is greater than 9.11."
    router, main = scripted.exchanges
    assert router.path == FLASH_LITE + "generateContent"
    assert main.path == FLASH + "streamGenerateContent?alt=sse"
    assert names_asked(gemini_gateway, funded_key.account_id, 2) == [
        (f"{ROUTER_MODEL}:generateContent", "gemini-gw-lite"),
        (f"{answering_name}:streamGenerateContent", "gemini-gw"),
    ]
    generations = assert_charged_what_google_reported(
        app,
        gemini_gateway,
        funded_key,
        [("gemini-gw-lite", router_says), ("gemini-gw", "gemini_stream")],
    )
    assert {g.model: g.streamed for g in generations} == {
        "gemini-gw-lite": False,
        "gemini-gw": True,
    }


def test_the_guide_names_exactly_the_aliases_answering_the_clis_defaults():
    guide = GUIDE.read_text()
    assert f'aliases = ["{ROUTER_MODEL}"]' in guide
    assert f"aliases = {json.dumps(MAIN_MODELS)}" in guide
