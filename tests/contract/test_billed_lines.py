"""Every line an upstream bills is priced: 1-hour cache writes, server and hosted tools, tiers.

Gunicorn serves a catalog that prices them; the replay server answers as Anthropic's and
OpenAI's APIs do when a request wrote to the prompt cache for an hour, searched the web,
ran code and was served in the priority tier. Callers use the real SDKs. What is charged
is read from the ledger and the balance; what reached the upstream from the replay
server's record: a tool or tier the catalog does not price reaches nothing.
"""

from __future__ import annotations

from decimal import Decimal

import anthropic
import openai
import pytest

from tests.contract.conftest import billing_records, gateway_serving
from tests.upstream_server import Reply

CATALOG = """
[upstreams.claude]
kind = "anthropic"
base_url = "{url}/claude"
retries = 0

[upstreams.openai]
kind = "openai"
base_url = "{url}/openai/v1"
retries = 0

[[models]]
id = "claude-priced"
max_output_tokens = 4096
capabilities = ["tools"]
routes = [{{ upstream = "claude", model = "claude-sonnet-4-5-20250929" }}]
[models.pricing]
prompt = 3
completion = 15
cached_read = 0.30
cache_write = 3.75
cache_write_1h = 6
tool_calls = {{ web_search = 0.01, web_fetch = 0.002, code_execution = 0.03, container = 0.05 }}
tiers = {{ priority = 2 }}

[[models]]
id = "claude-plain"
max_output_tokens = 4096
pricing = {{ prompt = 3, completion = 15, cache_write = 3.75 }}
routes = [{{ upstream = "claude", model = "claude-sonnet-4-5-20250929" }}]

[[models]]
id = "gpt-priced"
max_output_tokens = 4096
capabilities = ["tools"]
routes = [{{ upstream = "openai", model = "gpt-5-2025-08-07", api = "responses" }}]
[models.pricing]
prompt = 1.25
completion = 10
cached_read = 0.125
tool_calls = {{ web_search = 0.01, file_search = 0.0025 }}
tiers = {{ priority = 2, flex = 0.5 }}

[[models]]
id = "gpt-chat"
max_output_tokens = 4096
extra_params = ["service_tier"]
pricing = {{ prompt = 0.15, completion = 0.60, tiers = {{ flex = 0.5 }} }}
routes = [{{ upstream = "openai", model = "gpt-4o-mini-2024-07-18" }}]

[[models]]
id = "gpt-search"
max_output_tokens = 4096
extra_params = ["web_search_options"]
pricing = {{ prompt = 2.5, completion = 10, tool_calls = {{ web_search = 0.025 }} }}
routes = [{{ upstream = "openai", model = "gpt-4o-search-preview" }}]

[[models]]
id = "gpt-search-unpriced"
max_output_tokens = 4096
extra_params = ["web_search_options"]
pricing = {{ prompt = 2.5, completion = 10 }}
routes = [{{ upstream = "openai", model = "gpt-4o-search-preview" }}]
"""
# What the Anthropic transcripts (anthropic_*_server_tools) come to at claude-priced's
# prices: 40 input tokens at 3, 512 written for 5 minutes at 3.75, 1024 for an hour at 6,
# 120 output at 15 (per million); 2 web searches at 0.01, a code execution at 0.03, its
# container at 0.05; all of it twice over, in the priority tier the answer names.
CLAUDE_COST = (
    (40 * 3 + 512 * Decimal("3.75") + 1024 * 6 + 120 * 15) / 1_000_000
    + 2 * Decimal("0.01")
    + Decimal("0.03")
    + Decimal("0.05")
) * 2
# The Responses transcripts (openai_response_*hosted_tools) at gpt-priced's prices: 1500
# input tokens at 1.25, 500 cached at 0.125, 300 output at 10; 2 web searches at 0.01, a
# file search at 0.0025; twice over, in the priority tier.
GPT_COST = (
    (1500 * Decimal("1.25") + 500 * Decimal("0.125") + 300 * 10) / 1_000_000
    + 2 * Decimal("0.01")
    + Decimal("0.0025")
) * 2
WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
CODE_EXECUTION = {"type": "code_execution_20250825", "name": "code_execution"}
ASKED = [{"role": "user", "content": "Is Paris warmer than Rome today?"}]


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("billed-lines")
    with gateway_serving(CATALOG.format(url=upstream.url), database_url, folder) as gateway:
        yield gateway


@pytest.fixture(autouse=True)
def scripted(upstream):
    """Every test scripts its upstream replies, and uses all of them."""
    upstream.reset()
    yield upstream
    assert upstream.unused_replies() == {}


@pytest.fixture
def funded(make_funded_key):
    return make_funded_key(Decimal("5"))


@pytest.fixture
def claude(gateway, funded, monkeypatch, tmp_path):
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return anthropic.Anthropic(base_url=gateway.url, api_key=funded.key, max_retries=0, timeout=30)


@pytest.fixture
def client(gateway, funded):
    return openai.OpenAI(
        base_url=f"{gateway.url}/v1", api_key=funded.key, max_retries=0, timeout=30
    )


def charged_once(app, funded, cost: Decimal):
    """Check the account paid ``cost`` for its one generation, exactly; return the generation."""
    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    assert generation.cost == cost and generation.shortfall == 0
    assert charge.amount == -cost
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0
    assert account.balance == Decimal("5") - cost
    return generation


def nothing_charged(app, funded, scripted) -> None:
    """Check that the upstream was sent nothing, and the account held and paid nothing."""
    account, generations, charges, holds = billing_records(app, funded.account_id)
    assert scripted.exchanges == []
    assert (generations, charges, holds) == ([], [], [])
    assert account.balance == Decimal("5") and account.reserved == 0


def audit_clean(runner, funded) -> None:
    audit = runner.invoke(args=["ledger", "audit", "--account", str(funded.account_id)])
    assert audit.exit_code == 0, audit.output
    assert "generations: 0 mismatches, 0 shortfalls, 0 estimated" in audit.output


def claude_lines_recorded(generation) -> None:
    """Check that a generation of the Anthropic transcripts recorded each billed line."""
    assert (generation.cache_write_tokens, generation.cache_write_1h_tokens) == (1536, 1024)
    assert (generation.price_cache_write, generation.price_cache_write_1h) == (
        Decimal("3.75"),
        Decimal(6),
    )
    assert generation.tool_calls == {
        "code_execution": {"calls": 1, "price": "0.03"},
        "container": {"calls": 1, "price": "0.05"},
        "web_search": {"calls": 2, "price": "0.01"},
    }
    assert (generation.service_tier, generation.tier_multiplier) == ("priority", Decimal(2))


def cost_in(usage) -> Decimal:
    return Decimal(str(usage.model_extra["cost"]["total_cost"]))


def test_a_message_passed_through_pays_its_hour_long_cache_writes_server_tools_and_tier(
    app, claude, funded, scripted, runner
):
    scripted.script("/claude", Reply("anthropic_message_server_tools"))

    message = claude.messages.create(
        model="claude-priced",
        max_tokens=1024,
        messages=ASKED,
        tools=[WEB_SEARCH, CODE_EXECUTION],
        service_tier="auto",
    )

    sent = scripted.exchanges[0].json
    assert [tool["type"] for tool in sent["tools"]] == [WEB_SEARCH["type"], CODE_EXECUTION["type"]]
    assert message.usage.cache_creation.ephemeral_1h_input_tokens == 1024
    assert message.usage.server_tool_use.web_search_requests == 2
    generation = charged_once(app, funded, CLAUDE_COST)
    assert cost_in(message.usage) == CLAUDE_COST
    claude_lines_recorded(generation)
    audit_clean(runner, funded)


def test_a_streamed_message_passed_through_pays_the_lines_its_events_report(
    app, claude, funded, scripted, runner
):
    scripted.script("/claude", Reply("anthropic_stream_server_tools", write_size=29))

    with claude.messages.stream(
        model="claude-priced", max_tokens=1024, messages=ASKED, tools=[WEB_SEARCH, CODE_EXECUTION]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()

    assert final.content[-1].text == "Paris is 18 C, 3 degrees cooler than Rome."
    generation = charged_once(app, funded, CLAUDE_COST)
    assert cost_in(events[-2].usage) == CLAUDE_COST
    claude_lines_recorded(generation)
    assert generation.streamed and not generation.estimated
    audit_clean(runner, funded)


@pytest.mark.parametrize(
    ("stream", "transcript"),
    [(False, "anthropic_message_server_tools"), (True, "anthropic_stream_server_tools")],
)
def test_a_translated_anthropic_answer_pays_every_line_its_usage_reports(
    app, client, funded, scripted, runner, stream, transcript
):
    scripted.script("/claude", Reply(transcript))

    answer = client.chat.completions.create(
        model="claude-priced",
        messages=ASKED,
        stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )
    usage = list(answer)[-1].usage if stream else answer.usage

    assert scripted.exchanges[0].path == "/claude/v1/messages"
    generation = charged_once(app, funded, CLAUDE_COST)
    assert cost_in(usage) == CLAUDE_COST
    claude_lines_recorded(generation)
    audit_clean(runner, funded)


@pytest.mark.parametrize(
    ("stream", "transcript"),
    [(False, "openai_response_hosted_tools"), (True, "openai_response_stream_hosted_tools")],
)
def test_a_response_passed_through_pays_its_hosted_tool_calls_in_the_priority_tier(
    app, client, funded, scripted, runner, stream, transcript
):
    scripted.script("/openai", Reply(transcript, write_size=64))

    answer = client.responses.create(
        model="gpt-priced",
        input="Is Paris warmer than Rome today?",
        tools=[
            {"type": "web_search"},
            {"type": "file_search", "vector_store_ids": ["vs_000000000000000000000001"]},
        ],
        service_tier="priority",
        stream=stream,
    )
    response = list(answer)[-1].response if stream else answer

    sent = scripted.exchanges[0].json
    assert sent["service_tier"] == "priority"
    assert [tool["type"] for tool in sent["tools"]] == ["web_search", "file_search"]
    generation = charged_once(app, funded, GPT_COST)
    assert cost_in(response.usage) == GPT_COST
    assert generation.tool_calls == {
        "file_search": {"calls": 1, "price": "0.0025"},
        "web_search": {"calls": 2, "price": "0.01"},
    }
    assert (generation.service_tier, generation.tier_multiplier) == ("priority", Decimal(2))
    audit_clean(runner, funded)


def test_a_server_tool_the_catalog_does_not_price_is_refused_before_anything_is_sent(
    app, claude, funded, scripted
):
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model="claude-plain", max_tokens=100, messages=ASKED, tools=[WEB_SEARCH]
        )

    error = refused.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "'web_search'" in error["error"]["message"]
    assert "claude-plain" in error["error"]["message"]
    nothing_charged(app, funded, scripted)


@pytest.mark.parametrize(
    ("model", "asked", "named"),
    [
        ("gpt-priced", {"tools": [{"type": "code_interpreter"}]}, "'code_interpreter'"),
        ("gpt-priced", {"tools": [{"type": "image_generation"}]}, "'image_generation'"),
        ("gpt-priced", {"service_tier": "scale"}, "'scale'"),
    ],
)
def test_a_hosted_tool_or_tier_the_catalog_does_not_price_is_refused_on_the_responses_door(
    app, client, funded, scripted, model, asked, named
):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=model, input="Hi", **asked)

    error = refused.value.body
    assert error["type"] == "invalid_request_error"
    assert named in error["message"] and model in error["message"]
    nothing_charged(app, funded, scripted)


def test_a_tier_the_catalog_does_not_price_is_refused_on_the_chat_door(
    app, client, funded, scripted
):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="gpt-chat", messages=ASKED, service_tier="priority")

    assert "'priority'" in refused.value.body["message"]
    assert refused.value.body["param"] == "service_tier"
    nothing_charged(app, funded, scripted)


def test_a_chat_request_is_priced_in_the_tier_its_upstream_says_it_served(
    app, client, funded, scripted
):
    scripted.script("/openai", Reply("openai_chat"))

    completion = client.chat.completions.create(
        model="gpt-chat", messages=ASKED, service_tier="flex"
    )

    assert scripted.exchanges[0].json["service_tier"] == "flex"
    # The upstream answered in its default tier (openai_chat says so), not the flex tier
    # asked for: no discount.
    generation = charged_once(app, funded, cost_in(completion.usage))
    usage = completion.usage
    assert (
        generation.cost
        == (usage.prompt_tokens * Decimal("0.15") + usage.completion_tokens * Decimal("0.60"))
        / 1_000_000
    )
    assert (generation.service_tier, generation.tier_multiplier) == ("default", Decimal(1))


def test_a_hold_covers_the_server_tool_calls_a_request_allows(
    app, gateway, make_funded_key, scripted, monkeypatch, tmp_path
):
    # At most 10 searches at $0.01 (and a few tokens): more than $0.05 can cover.
    poor = make_funded_key(Decimal("0.05"))
    claude = anthropic.Anthropic(base_url=gateway.url, api_key=poor.key, max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as refused:
        claude.messages.create(
            model="claude-priced",
            max_tokens=100,
            messages=ASKED,
            tools=[{**WEB_SEARCH, "max_uses": 10}],
        )

    assert refused.value.status_code == 402
    assert scripted.exchanges == []


def test_calls_beyond_what_the_hold_covered_are_charged_in_full(
    app, claude, funded, scripted, runner
):
    # The request allows one search and no code execution; the answer reports more of both.
    scripted.script("/claude", Reply("anthropic_message_server_tools"))

    claude.messages.create(
        model="claude-priced",
        max_tokens=1024,
        messages=ASKED,
        tools=[{**WEB_SEARCH, "max_uses": 1}],
    )

    account, (generation,), _, (hold,) = billing_records(app, funded.account_id)
    assert hold.amount < CLAUDE_COST == generation.cost
    assert account.balance == Decimal("5") - CLAUDE_COST
    audit_clean(runner, funded)


def test_the_models_list_shows_the_tool_call_and_tier_prices(client):
    pricing = client.models.retrieve("claude-priced").model_extra["pricing"]

    assert (pricing["cache_write"], pricing["cache_write_1h"]) == (3.75, 6)
    assert pricing["tool_calls"] == {
        "web_search": 0.01,
        "web_fetch": 0.002,
        "code_execution": 0.03,
        "container": 0.05,
    }
    assert pricing["tiers"] == {"priority": 2}
    plain = client.models.retrieve("claude-plain").model_extra["pricing"]
    assert plain["cache_write_1h"] == 3.75 and "tool_calls" not in plain


def test_a_response_stream_cut_before_its_last_event_pays_the_hosted_calls_it_made(
    app, client, funded, scripted
):
    # Cut after both searches, the file search and the text: before response.completed.
    scripted.script("/openai", Reply("openai_response_stream_hosted_tools", close_after_events=14))

    with pytest.raises(openai.APIError):
        for _ in client.responses.create(
            model="gpt-priced",
            input="Is Paris warmer than Rome today?",
            tools=[
                {"type": "web_search"},
                {"type": "file_search", "vector_store_ids": ["vs_000000000000000000000001"]},
            ],
            stream=True,
        ):
            pass

    account, (generation,), (charge,), holds = billing_records(app, funded.account_id)
    assert generation.tool_calls == {
        "file_search": {"calls": 1, "price": "0.0025"},
        "web_search": {"calls": 2, "price": "0.01"},
    }
    assert generation.estimated and generation.prompt_tokens > 0
    assert generation.cost >= 2 * Decimal("0.01") + Decimal("0.0025")
    assert charge.amount == -generation.cost
    assert [hold.status for hold in holds] == ["settled"] and account.reserved == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_chat_request_with_web_search_options_pays_its_search(
    app, client, funded, scripted, runner, stream
):
    # A search model searches once for a request with web_search_options: one call.
    scripted.script("/openai", Reply("openai_chat_stream" if stream else "openai_chat"))
    options = {"search_context_size": "low"}

    if stream:
        chunks = list(
            client.chat.completions.create(
                model="gpt-search",
                messages=ASKED,
                web_search_options=options,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage = chunks[-1].usage
    else:
        usage = client.chat.completions.create(
            model="gpt-search", messages=ASKED, web_search_options=options
        ).usage

    assert scripted.exchanges[0].json["web_search_options"] == options
    tokens = usage.prompt_tokens * Decimal("2.5") + usage.completion_tokens * 10
    generation = charged_once(app, funded, tokens / 1_000_000 + Decimal("0.025"))
    assert cost_in(usage) == generation.cost
    assert generation.tool_calls == {"web_search": {"calls": 1, "price": "0.025"}}
    audit_clean(runner, funded)


def test_web_search_options_on_a_model_that_does_not_price_search_is_refused(
    app, client, funded, scripted
):
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="gpt-search-unpriced", messages=ASKED, web_search_options={}
        )

    error = refused.value.body
    assert error["param"] == "web_search_options" and error["type"] == "invalid_request_error"
    assert "'web_search'" in error["message"] and "gpt-search-unpriced" in error["message"]
    nothing_charged(app, funded, scripted)
