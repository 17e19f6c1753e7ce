"""What a passed-through request sends is what its hold counts, on the Messages and Responses doors.

Gunicorn serves a catalog whose routes pass requests through to the replay server, which
plays an Anthropic upstream and an OpenAI upstream serving /v1/responses; callers use
the anthropic and openai SDKs. The text the tests hide (20,000 tokens) is in blocks and
items the doors' translations never read; the long-prompt transcripts report the usage a
real upstream reports for it.
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import anthropic
import openai
import pytest
from openai.types.responses import Response

from app.catalog.pricing import cost_of
from app.encoding import loads
from app.providers.anthropic import usage_from
from app.responses.native import reported_usage
from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import Reply, load_transcript

CATALOG = """
[upstreams.claude]
kind = "anthropic"
base_url = "{url}/claude"
api_key_env = "CLAUDE_API_KEY"
retries = 0

[upstreams.openai]
kind = "openai"
base_url = "{url}/openai/v1"
retries = 0

[upstreams.vllm]
kind = "openai"
base_url = "{url}/vllm/v1"
retries = 0

[[models]]
id = "claude-sonnet"
context_length = 200000
max_output_tokens = 8192
capabilities = ["tools", "reasoning", "vision"]
pricing = {{ prompt = 3, completion = 15, cached_read = 0.30, cache_write = 3.75 }}
routes = [{{ upstream = "claude", model = "claude-sonnet-4-5-20250929" }}]

[[models]]
id = "gpt-five"
context_length = 400000
max_output_tokens = 4096
capabilities = ["tools", "reasoning", "vision"]
pricing = {{ prompt = 1.25, completion = 10, cached_read = 0.125 }}
routes = [{{ upstream = "openai", model = "gpt-5-mini-2025-08-07", api = "responses" }}]

[[models]]
id = "qwen-chat"
context_length = 32000
max_output_tokens = 2048
pricing = {{ prompt = 0.1, completion = 0.4 }}
routes = [{{ upstream = "vllm", model = "Qwen/Qwen3-8B" }}]
"""
# 20,000 tokens by any of the encodings (a word a token), 100 kB.
HIDDEN = " ".join(["word"] * 20_000)
ASKED = "Summarize what you were given."
PDF = base64.b64encode(b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\n%%EOF\n").decode()
WAV = base64.b64encode(b"RIFF\x24\x00\x00\x00WAVEfmt ").decode()


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("passed-through-prompts")
    with gateway_serving(
        CATALOG.format(url=upstream.url), database_url, folder, CLAUDE_API_KEY="sk-ant-test-secret"
    ) as gateway:
        yield gateway


@pytest.fixture(autouse=True)
def scripted(upstream):
    """Every test scripts its upstream replies."""
    upstream.reset()
    yield upstream
    upstream.reset()


@pytest.fixture
def claude_with(gateway, make_funded_key, monkeypatch, tmp_path):
    """``claude_with(credits)``: an account with ``credits`` USD, and an anthropic client."""
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))

    def make(credits: str):
        funded = make_funded_key(Decimal(credits))
        client = anthropic.Anthropic(
            base_url=gateway.url, api_key=funded.key, max_retries=0, timeout=60
        )
        return funded, client

    return make


@pytest.fixture
def openai_with(gateway, make_funded_key):
    """``openai_with(credits)``: an account with ``credits`` USD, and an openai client."""

    def make(credits: str):
        funded = make_funded_key(Decimal(credits))
        client = openai.OpenAI(
            base_url=f"{gateway.url}/v1", api_key=funded.key, max_retries=0, timeout=60
        )
        return funded, client

    return make


def transcript_body(name: str) -> dict:
    return loads(load_transcript(name)[1])


def user(*blocks: dict) -> dict:
    return {"role": "user", "content": [*blocks, {"type": "text", "text": ASKED}]}


# The same text, as a Messages body can carry it: in a text block, and where the
# translation does not look.
MESSAGES_CARRYING_IT = {
    "a text block": [user({"type": "text", "text": HIDDEN})],
    "a search result": [
        user(
            {
                "type": "search_result",
                "source": "https://example.com/notes",
                "title": "Notes",
                "content": [{"type": "text", "text": HIDDEN}],
            }
        )
    ],
    "a document of content blocks": [
        user(
            {
                "type": "document",
                "source": {"type": "content", "content": [{"type": "text", "text": HIDDEN}]},
                "context": HIDDEN,
            }
        )
    ],
    "an earlier thinking block": [
        {"role": "user", "content": "Think."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": HIDDEN, "signature": "c2lnbmF0dXJl"},
                {"type": "text", "text": "Done."},
            ],
        },
        {"role": "user", "content": ASKED},
    ],
    "a server tool's result": [
        {"role": "user", "content": "Search."},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_01",
                    "name": "web_search",
                    "input": {"query": "paris"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_01",
                    "content": [
                        {
                            "type": "web_search_result",
                            "url": "https://example.com",
                            "title": "Paris",
                            "encrypted_content": HIDDEN,
                        }
                    ],
                },
            ],
        },
        {"role": "user", "content": ASKED},
    ],
    "a block of a type added later": [user({"type": "notes_2027", "notes": HIDDEN})],
    # A tool call's input is JSON the model reads: what looks like an image there is text.
    "a tool call's input shaped as an image": [
        {"role": "user", "content": "Take notes."},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "notes",
                    "input": {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": HIDDEN},
                    },
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "noted"},
                {"type": "text", "text": ASKED},
            ],
        },
    ],
}


@pytest.mark.parametrize("carrier", MESSAGES_CARRYING_IT)
def test_text_the_translation_does_not_read_is_refused_402_like_a_text_block(
    app, claude_with, scripted, carrier
):
    # 20,000 tokens cost $0.06 at $3 per million: $0.05 cannot hold them, wherever they are.
    funded, claude = claude_with("0.05")

    with pytest.raises(anthropic.APIStatusError) as refused:
        claude.messages.create(
            model="claude-sonnet", max_tokens=100, messages=MESSAGES_CARRYING_IT[carrier]
        )

    assert refused.value.status_code == 402
    assert refused.value.body["error"]["type"] == "billing_error"
    assert scripted.exchanges == []
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert (generations, charges, account.balance) == ([], [], Decimal("0.05"))


def test_count_tokens_counts_what_a_hold_counts(claude_with):
    _, claude = claude_with("1")

    counts = {
        carrier: claude.messages.count_tokens(model="claude-sonnet", messages=messages)
        for carrier, messages in MESSAGES_CARRYING_IT.items()
    }

    plain = counts["a text block"].input_tokens
    assert plain >= 20_000
    for carrier, counted in counts.items():
        assert counted.input_tokens >= plain - 50, carrier


def concurrently(call, times: int) -> list:
    """Run ``call`` ``times`` at once; return what each returned or raised."""

    def outcome(_):
        try:
            return call()
        except (anthropic.APIStatusError, openai.APIStatusError) as error:
            return error

    with ThreadPoolExecutor(max_workers=times) as pool:
        return list(pool.map(outcome, range(times)))


def test_twenty_four_requests_at_once_never_send_more_than_the_balance_pays(
    app, gateway, claude_with, scripted
):
    scripted.script("/claude", *[Reply("anthropic_message_long_prompt")] * 24)
    funded, claude = claude_with("0.10")
    messages = MESSAGES_CARRYING_IT["a search result"]

    outcomes = concurrently(
        lambda: claude.messages.create(model="claude-sonnet", max_tokens=100, messages=messages),
        24,
    )

    answered = [outcome for outcome in outcomes if isinstance(outcome, anthropic.types.Message)]
    refused = [outcome for outcome in outcomes if outcome not in answered]
    assert answered and {error.status_code for error in refused} == {402}
    assert len(scripted.exchanges) == len(answered)
    # What the upstream reports for what it was sent, at the catalog's price.
    reported = usage_from(transcript_body("anthropic_message_long_prompt")["usage"])
    sent_worth = len(answered) * cost_of(reported, gateway.catalog.resolve("claude-sonnet").pricing)
    assert sent_worth <= Decimal("0.10")
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert account.balance == Decimal("0.10") - sent_worth and account.reserved == 0
    assert all(generation.shortfall == 0 for generation in generations)


# The same text as a Responses body can carry it, where the translation does not look.
ITEMS_CARRYING_IT = {
    "a custom tool call's output": [
        {"type": "custom_tool_call", "call_id": "call_1", "name": "notes", "input": "all"},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": HIDDEN},
    ],
    "a hosted tool's item": [
        {
            "type": "file_search_call",
            "id": "fs_1",
            "status": "completed",
            "queries": ["notes"],
            "results": [{"file_id": "file-1", "filename": "notes.txt", "text": HIDDEN}],
        }
    ],
    "a message's part of a type added later": [
        {"role": "user", "content": [{"type": "input_notes_2027", "notes": HIDDEN}]}
    ],
    "an item of a type added later": [{"type": "notes_2027", "id": "nt_1", "notes": HIDDEN}],
    "a tool output's part of a type added later": [
        {"type": "function_call", "call_id": "call_2", "name": "notes", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "summary_text_2027", "text": HIDDEN}],
        },
    ],
}


@pytest.mark.parametrize("carrier", ITEMS_CARRYING_IT)
def test_responses_items_the_translation_does_not_read_are_held_for(
    app, gateway, openai_with, scripted, carrier
):
    # 20,000 tokens cost $0.025 at $1.25 per million: $0.04 holds one request, not two.
    scripted.script("/openai", *[Reply("openai_response_long_prompt")] * 24)
    funded, client = openai_with("0.04")
    items = [*ITEMS_CARRYING_IT[carrier], {"role": "user", "content": ASKED}]

    outcomes = concurrently(
        lambda: client.responses.create(model="gpt-five", input=items, max_output_tokens=100),
        24,
    )

    answered = [outcome for outcome in outcomes if isinstance(outcome, Response)]
    refused = [outcome for outcome in outcomes if outcome not in answered]
    assert answered and {error.status_code for error in refused} == {402}
    assert len(scripted.exchanges) == len(answered)
    assert scripted.exchanges[0].json["input"][:-1] == ITEMS_CARRYING_IT[carrier]
    reported = reported_usage(transcript_body("openai_response_long_prompt"))
    sent_worth = len(answered) * cost_of(reported, gateway.catalog.resolve("gpt-five").pricing)
    assert sent_worth <= Decimal("0.04")
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert account.balance == Decimal("0.04") - sent_worth and account.reserved == 0
    assert all(generation.shortfall == 0 for generation in generations)


def test_a_message_without_usage_is_settled_at_once_for_the_prompt_its_hold_counted(
    app, claude_with, scripted
):
    scripted.script("/claude", Reply("anthropic_message_no_usage"))
    funded, claude = claude_with("5")

    message = claude.messages.create(
        model="claude-sonnet", max_tokens=100, messages=MESSAGES_CARRYING_IT["a search result"]
    )

    account, (generation,), (charge,), (hold,) = billing_records(app, funded.account_id)
    assert hold.status == "settled" and account.reserved == 0
    assert (generation.status, generation.estimated) == ("completed", True)
    # Never below what the upstream read: the 20,000 hidden tokens and the rest.
    assert generation.prompt_tokens >= 20_000 and generation.completion_tokens > 0
    assert -charge.amount == generation.cost > 0
    assert message.usage.input_tokens == generation.prompt_tokens
    assert Decimal(str(message.usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_a_message_that_cannot_be_read_is_settled_at_once_never_for_nothing(
    app, claude_with, scripted
):
    scripted.script("/claude", Reply("anthropic_message_truncated"))
    funded, claude = claude_with("5")

    with pytest.raises(anthropic.APIStatusError) as failed:
        claude.messages.create(
            model="claude-sonnet", max_tokens=100, messages=[user({"type": "text", "text": "Hi"})]
        )

    assert failed.value.status_code == 502
    account, (generation,), (charge,), (hold,) = billing_records(app, funded.account_id)
    assert hold.status == "settled" and account.reserved == 0
    assert (generation.status, generation.estimated) == ("failed", True)
    assert generation.prompt_tokens > 0 and -charge.amount == generation.cost > 0


def test_a_response_that_cannot_be_read_is_settled_at_once_never_for_nothing(
    app, openai_with, scripted
):
    scripted.script("/openai", Reply("openai_response_truncated"))
    funded, client = openai_with("5")

    with pytest.raises(openai.APIStatusError) as failed:
        client.responses.create(
            model="gpt-five", input=[*ITEMS_CARRYING_IT["a hosted tool's item"]]
        )

    assert failed.value.status_code == 502
    account, (generation,), (charge,), (hold,) = billing_records(app, funded.account_id)
    assert hold.status == "settled" and account.reserved == 0
    assert (generation.status, generation.estimated) == ("failed", True)
    assert generation.prompt_tokens >= 20_000 and -charge.amount == generation.cost > 0


FILES_AND_RECORDINGS = [
    {
        "type": "input_file",
        "filename": "notes.pdf",
        "file_data": f"data:application/pdf;base64,{PDF}",
    },
    {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}},
    {"type": "input_text", "text": ASKED},
]


def test_files_and_recordings_are_passed_on_held_as_filling_the_context(
    app, gateway, openai_with, scripted
):
    scripted.script("/openai", Reply("openai_response"))
    funded, client = openai_with("5")
    sent = [{"role": "user", "content": FILES_AND_RECORDINGS}]

    client.responses.create(model="gpt-five", input=sent, max_output_tokens=100)

    (exchange,) = scripted.exchanges
    assert exchange.json["input"] == sent
    account, (generation,), _, (hold,) = billing_records(app, funded.account_id)
    # The whole context, 400,000 tokens at $1.25 per million, and 100 out at $10.
    assert hold.amount == Decimal("0.5") + Decimal("0.001")
    assert generation.cost == cost_of(
        reported_usage(transcript_body("openai_response")),
        gateway.catalog.resolve("gpt-five").pricing,
    )


def test_a_file_costs_its_hold_the_context_so_a_small_balance_is_refused_before_sending(
    openai_with, scripted
):
    _, client = openai_with("0.10")

    with pytest.raises(openai.APIStatusError) as refused:
        client.responses.create(
            model="gpt-five", input=[{"role": "user", "content": FILES_AND_RECORDINGS}]
        )

    assert refused.value.status_code == 402 and scripted.exchanges == []


def test_a_translated_route_refuses_a_file_it_cannot_show(openai_with, scripted):
    _, client = openai_with("5")

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="qwen-chat", input=[{"role": "user", "content": FILES_AND_RECORDINGS}]
        )

    assert refused.value.body["code"] == "unsupported_content"
    assert "input_file" in refused.value.body["message"] and scripted.exchanges == []


def test_a_pdf_document_goes_to_an_anthropic_route_as_sent(app, claude_with, scripted):
    scripted.script("/claude", Reply("anthropic_message"))
    funded, claude = claude_with("5")
    document = {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
        "title": "Notes",
    }

    claude.messages.create(model="claude-sonnet", max_tokens=100, messages=[user(document)])

    (exchange,) = scripted.exchanges
    assert exchange.json["messages"][0]["content"][0] == document
    account, (generation,), _, (hold,) = billing_records(app, funded.account_id)
    # The whole context, 200,000 tokens at $3.75 per million (cache writes), and 100 at $15.
    assert hold.amount == Decimal("0.75") + Decimal("0.0015")


def test_binary_no_rule_counts_is_refused_in_anthropics_envelope_before_sending(
    claude_with, scripted
):
    _, claude = claude_with("5")
    recording = {
        "type": "audio_2027",
        "source": {"type": "base64", "media_type": "audio/wav", "data": WAV},
    }

    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="claude-sonnet", max_tokens=100, messages=[user(recording)])

    assert refused.value.body["type"] == "error"
    assert refused.value.body["error"]["type"] == "invalid_request_error"
    assert "audio/wav" in refused.value.body["error"]["message"]
    assert scripted.exchanges == []
