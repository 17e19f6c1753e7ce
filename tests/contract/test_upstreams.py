"""Real upstreams end to end: gunicorn routes models to a local server replaying transcripts.

The gateway runs as in production, with a catalog whose upstreams are an own vLLM-like
server (no key), an OpenAI-compatible third party and Anthropic, all served by the replay
server, plus a dead address. Callers use the official openai SDK, or raw HTTP where the
test must see the stream's bytes or hang up mid-stream.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal

import openai
import pytest
import requests

from app.catalog.pricing import cost_of
from app.providers.base import ChatRequest, Usage
from app.providers.tokens import count_text, encoding_named
from tests.contract.conftest import billing_records as records
from tests.contract.conftest import gateway_serving
from tests.upstream_server import Reply, closed_port

THIRD_KEY = "sk-third-test-secret"
CLAUDE_KEY = "sk-ant-test-secret"
CATALOG = """
[upstreams.own]
kind = "openai"
base_url = "{url}/own/v1"
read_timeout = 2
retries = 1

[upstreams.own-slow]
kind = "openai"
base_url = "{url}/slow/v1"
read_timeout = 0.5
retries = 0

[upstreams.third]
kind = "openai"
base_url = "{url}/third/v1"
api_key_env = "THIRD_API_KEY"
tokenizer = "o200k_base"
retries = 1

[upstreams.claude]
kind = "anthropic"
base_url = "{url}/claude"
api_key_env = "CLAUDE_API_KEY"
retries = 1

[upstreams.dead]
kind = "openai"
base_url = "http://127.0.0.1:{dead}/v1"
connect_timeout = 1
retries = 1

[[models]]
id = "qwen3-8b"
context_length = 32768
max_output_tokens = 2048
capabilities = ["tools", "json_schema", "reasoning"]
extra_params = ["top_k", "chat_template_kwargs"]
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [{{ upstream = "own", model = "Qwen/Qwen3-8B" }}]

[[models]]
id = "qwen3-8b-slow"
max_output_tokens = 512
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [{{ upstream = "own-slow", model = "Qwen/Qwen3-8B" }}]

[[models]]
id = "gpt-mini"
context_length = 128000
max_output_tokens = 4096
capabilities = ["tools", "json_schema", "vision"]
pricing = {{ prompt = 0.15, completion = 0.60, cached_read = 0.075 }}
routes = [{{ upstream = "third", model = "gpt-4o-mini-2024-07-18" }}]

[[models]]
id = "claude-sonnet"
context_length = 200000
max_output_tokens = 8192
capabilities = ["tools", "reasoning", "vision"]
pricing = {{ prompt = 3, completion = 15, cached_read = 0.30 }}
routes = [{{ upstream = "claude", model = "claude-sonnet-4-5-20250929" }}]

[[models]]
id = "resilient"
max_output_tokens = 2048
capabilities = ["reasoning"]
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [
  {{ upstream = "dead", model = "Qwen/Qwen3-8B" }},
  {{ upstream = "own", model = "Qwen/Qwen3-8B" }},
]

[[models]]
id = "doomed"
max_output_tokens = 2048
pricing = {{ prompt = 0.10, completion = 0.40 }}
routes = [
  {{ upstream = "dead", model = "gpt-4o-mini-2024-07-18" }},
  {{ upstream = "third", model = "gpt-4o-mini-2024-07-18" }},
]
"""
HELLO = [{"role": "user", "content": "Hello"}]
UPSTREAM_DETAILS = (
    "127.0.0.1",
    "sk-",
    "qwen/",
    "gpt-4o",
    "claude-sonnet-4",
    "deepinfra",
    "api key",
)


@pytest.fixture(scope="module")
def gateway(app, database_url, upstream, tmp_path_factory):
    """Gunicorn serving a catalog of real upstreams (the replay server and a dead port)."""
    folder = tmp_path_factory.mktemp("upstreams")
    catalog = CATALOG.format(url=upstream.url, dead=closed_port())
    with gateway_serving(
        catalog, database_url, folder, THIRD_API_KEY=THIRD_KEY, CLAUDE_API_KEY=CLAUDE_KEY
    ) as gateway:
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
def client(gateway, funded):
    return openai.OpenAI(
        base_url=f"{gateway.url}/v1", api_key=funded.key, max_retries=0, timeout=30
    )


def post(gateway, key, body, **kwargs):
    return requests.post(
        f"{gateway.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=body,
        timeout=30,
        **kwargs,
    )


def sse_events(response):
    """The data of every event of a streamed response, decoded (``[DONE]`` kept as is)."""
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            data = line[len(b"data: ") :]
            events.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return events


def delivered_pieces(events):
    return [
        choice["delta"][key]
        for event in events
        if isinstance(event, dict) and "choices" in event
        for choice in event["choices"]
        for key in ("content", "reasoning")
        if choice["delta"].get(key)
    ]


def wait_for_generation(app, account_id, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if records(app, account_id)[1]:
            # Read again: the statements of one read may straddle the settling commit.
            return records(app, account_id)
        time.sleep(0.05)
    raise AssertionError("the generation was never settled")


def assert_settled_once_at_its_price(gateway, found, model_id, start=Decimal("5")):
    account, generations, charges, holds = found
    (generation,) = generations
    (charge,) = charges
    usage = Usage(
        prompt_tokens=generation.prompt_tokens,
        completion_tokens=generation.completion_tokens,
        cached_tokens=generation.cached_tokens,
        prompt_image_tokens=generation.prompt_image_tokens,
        reasoning_tokens=generation.reasoning_tokens,
    )
    assert generation.cost == cost_of(usage, gateway.catalog.resolve(model_id).pricing)
    assert charge.amount == -generation.cost and charge.generation_id == generation.id
    assert [hold.status for hold in holds] == ["settled"]
    assert account.reserved == 0 and account.balance == start - generation.cost
    return generation


def assert_reveals_nothing(message):
    lowered = message.lower()
    for detail in UPSTREAM_DETAILS:
        assert detail not in lowered, detail


def test_own_server_answers_under_the_public_model_id(gateway, funded, scripted):
    scripted.script("/own", Reply("vllm_chat_reasoning"))
    body = {
        "model": "qwen3-8b",
        "messages": HELLO,
        "temperature": 0.6,
        "top_k": 20,
        "min_p": 0.1,
    }

    response = post(gateway, funded.key, body)

    assert response.status_code == 200, response.text
    assert "Qwen" not in response.text
    answer = response.json()
    assert answer["model"] == "qwen3-8b"
    message = answer["choices"][0]["message"]
    assert message["content"] == "\n\n9.8 is greater than 9.11."
    assert message["reasoning"].startswith("Okay, the user asks")
    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (22, 42)
    (exchange,) = scripted.exchanges
    assert exchange.path == "/own/v1/chat/completions"
    assert "authorization" not in exchange.headers
    assert exchange.json == {
        "model": "Qwen/Qwen3-8B",
        "messages": HELLO,
        "temperature": 0.6,
        "top_k": 20,
        "max_tokens": 2048,  # the model's max_output_tokens, which the hold was sized for
    }


@pytest.mark.parametrize("include_usage", [True, False])
def test_third_party_stream_relays_chunks_and_bills_its_usage(
    app, gateway, client, funded, scripted, include_usage
):
    scripted.script("/third", Reply("openai_chat_stream", write_size=9, pause=0.001))

    chunks = list(
        client.chat.completions.create(
            model="gpt-mini",
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": include_usage},
        )
    )

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello! How can I help you today?"
    assert {chunk.model for chunk in chunks} == {"gpt-mini"}
    (exchange,) = scripted.exchanges
    assert exchange.headers["authorization"] == f"Bearer {THIRD_KEY}"
    assert exchange.json["model"] == "gpt-4o-mini-2024-07-18"
    assert exchange.json["stream_options"] == {"include_usage": True}
    generation = assert_settled_once_at_its_price(
        gateway, records(app, funded.account_id), "gpt-mini"
    )
    assert (generation.prompt_tokens, generation.completion_tokens) == (19, 10)
    assert not generation.estimated
    if include_usage:
        usage = chunks[-1].usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (19, 10)
        assert Decimal(str(usage.model_extra["cost"]["total_cost"])) == generation.cost
    else:
        assert all(chunk.usage is None for chunk in chunks)


def test_streamed_tool_calls_reach_the_sdk_with_their_indexes(client, scripted):
    scripted.script("/third", Reply("openai_chat_stream_tools", write_size=5))
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }

    stream = client.chat.completions.create(
        model="gpt-mini", messages=HELLO, tools=[tool], stream=True
    )

    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    assert [json.loads(calls[i]["arguments"]) for i in (0, 1)] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    assert finish == "tool_calls"
    assert scripted.exchanges[0].json["tools"] == [tool]


def test_claude_answers_with_thinking_and_a_tool_call(app, gateway, client, funded, scripted):
    scripted.script("/claude", Reply("anthropic_message_tool_use"))
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }

    answer = client.chat.completions.create(
        model="claude-sonnet",
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        tools=[tool],
        reasoning_effort="low",
    )

    assert answer.model == "claude-sonnet"
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"] == "Paris"
    assert choice.message.model_extra["reasoning"].startswith("The user wants the weather")
    detail = choice.message.model_extra["reasoning_details"][0]
    assert detail["signature"].startswith("RXVJQ2ZE")
    (exchange,) = scripted.exchanges
    assert exchange.headers["x-api-key"] == CLAUDE_KEY
    sent = exchange.json
    assert (sent["model"], sent["system"]) == ("claude-sonnet-4-5-20250929", "Be brief.")
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent["tools"][0]["input_schema"] == {"type": "object"}
    generation = assert_settled_once_at_its_price(
        gateway, records(app, funded.account_id), "claude-sonnet"
    )
    assert (generation.prompt_tokens, generation.completion_tokens) == (1436, 96)
    assert answer.usage.prompt_tokens == 1436


def test_claude_streams_reasoning_then_text_with_cache_reads(
    app, gateway, client, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_stream_text", write_size=17))

    chunks = list(
        client.chat.completions.create(
            model="claude-sonnet",
            messages=HELLO,
            stream=True,
            stream_options={"include_usage": True},
        )
    )

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (2069, 10)
    assert usage.prompt_tokens_details.cached_tokens == 2048
    generation = assert_settled_once_at_its_price(
        gateway, records(app, funded.account_id), "claude-sonnet"
    )
    assert generation.cached_tokens == 2048


def test_claude_answers_and_chunks_carry_a_string_system_fingerprint(gateway, funded, scripted):
    scripted.script("/claude", Reply("anthropic_message"), Reply("anthropic_stream_text"))

    answer = post(gateway, funded.key, {"model": "claude-sonnet", "messages": HELLO})
    stream = post(
        gateway,
        funded.key,
        {
            "model": "claude-sonnet",
            "messages": HELLO,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        stream=True,
    )

    fingerprint = answer.json()["system_fingerprint"]
    assert isinstance(fingerprint, str) and fingerprint.startswith("fp_")
    chunks = [event for event in sse_events(stream) if event != "[DONE]"]
    assert chunks[-1]["usage"]["cost"]["total_cost"] > 0
    assert {chunk["system_fingerprint"] for chunk in chunks} == {fingerprint}


def test_claude_thinking_stream(client, scripted):
    scripted.script("/claude", Reply("anthropic_stream_thinking"))

    chunks = list(
        client.chat.completions.create(
            model="claude-sonnet", messages=HELLO, stream=True, reasoning_effort="high"
        )
    )

    reasoning = "".join(
        c.choices[0].delta.model_extra.get("reasoning") or "" for c in chunks if c.choices
    )
    assert reasoning.startswith("Compare 9.11 and 9.8")
    assert scripted.exchanges[0].json["thinking"] == {"type": "enabled", "budget_tokens": 6144}


def test_a_dead_route_fails_over_to_the_next(client, scripted):
    scripted.script("/own", Reply("vllm_chat_reasoning"))

    answer = client.chat.completions.create(model="resilient", messages=HELLO)

    assert answer.model == "resilient"
    assert answer.choices[0].message.content.endswith("9.8 is greater than 9.11.")


def test_an_upstream_refusing_the_gateways_key_is_a_502_revealing_nothing(
    gateway, client, scripted
):
    scripted.script("/third", Reply("openai_error_401"))

    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gpt-mini", messages=HELLO)

    assert caught.value.status_code == 502
    error = caught.value.response.json()["error"]
    assert (error["type"], error["code"]) == ("api_error", "upstream_error")
    assert_reveals_nothing(error["message"])
    assert len(scripted.exchanges) == 1
    log = gateway.log.read_text()
    assert "upstream third refused the gateway with 401" in log
    assert THIRD_KEY not in log and "Incorrect API key" not in log


def test_an_upstream_400_passes_its_message_on(client, scripted):
    scripted.script("/third", Reply("openai_error_400"))

    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="gpt-mini", messages=HELLO, response_format={"type": "json_object"}
        )

    error = caught.value.response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("'messages' must contain the word 'json'")
    assert error["param"] == "messages"


def test_all_routes_down_is_a_retryable_503(client, scripted):
    scripted.script("/third", Reply("openai_error_500"), Reply("openai_error_500"))

    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="doomed", messages=HELLO)

    assert caught.value.status_code == 503
    error = caught.value.response.json()["error"]
    assert (error["type"], error["code"]) == ("api_error", "upstream_unavailable")
    assert "retry" in error["message"].lower()


def test_a_failing_single_route_is_a_retryable_502(client, scripted):
    scripted.script("/third", Reply("openai_error_500"), Reply("openai_error_500"))

    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="gpt-mini", messages=HELLO)

    assert caught.value.status_code == 502
    assert "retry" in caught.value.response.json()["error"]["message"].lower()


def test_a_rate_limited_upstream_is_retried_after_the_wait_it_asks_for(client, scripted):
    scripted.script("/third", Reply("openai_error_429"), Reply("openai_chat"))

    answer = client.chat.completions.create(model="gpt-mini", messages=HELLO)

    assert answer.choices[0].message.content == "The capital of France is Paris."
    first, second = scripted.exchanges
    assert second.received_at - first.received_at >= 1.0  # its Retry-After: 1


def test_an_upstream_hanging_past_its_read_timeout(client, scripted):
    scripted.script("/slow", Reply(hang=True))
    started = time.monotonic()

    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="qwen3-8b-slow", messages=HELLO)

    assert caught.value.status_code == 504
    assert caught.value.response.json()["error"]["code"] == "upstream_timeout"
    assert time.monotonic() - started < 3
    assert scripted.exchanges[0].answered.wait(2)


def test_a_whole_answer_without_usage_is_counted_and_marked_estimated(
    app, gateway, client, funded, scripted
):
    scripted.script("/third", Reply("openai_chat_no_usage"))

    answer = client.chat.completions.create(model="gpt-mini", messages=HELLO)

    generation = assert_settled_once_at_its_price(
        gateway, records(app, funded.account_id), "gpt-mini"
    )
    assert generation.estimated
    o200k = encoding_named("o200k_base")
    assert generation.completion_tokens == count_text("The capital of France is Paris.", o200k)
    assert answer.usage.completion_tokens == generation.completion_tokens


@pytest.mark.parametrize(
    ("model", "prefix", "reply", "delivered", "upstream_prompt_tokens"),
    [
        (
            "qwen3-8b",
            "/own",
            Reply("openai_chat_stream", close_after_events=5),
            "Hello! How can",
            None,
        ),
        ("qwen3-8b", "/own", Reply("openai_chat_stream_malformed"), "Hello!", None),
        # Anthropic counts the prompt at message_start, before the stream broke off.
        ("claude-sonnet", "/claude", Reply("anthropic_stream_error"), "Once upon a time", 48),
    ],
    ids=["connection-dropped", "malformed-json", "error-event"],
)
def test_a_stream_failing_midway_ends_with_an_error_event_billed_for_what_was_delivered(
    app, gateway, funded, scripted, model, prefix, reply, delivered, upstream_prompt_tokens
):
    scripted.script(prefix, reply)

    response = post(
        gateway, funded.key, {"model": model, "messages": HELLO, "stream": True}, stream=True
    )

    assert response.status_code == 200
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "api_error" and set(error) == {"message", "type", "code", "param"}
    assert_reveals_nothing(error["message"])
    pieces = delivered_pieces(events)
    assert "".join(pieces) == delivered
    generation = assert_settled_once_at_its_price(gateway, records(app, funded.account_id), model)
    assert (generation.status, generation.estimated) == ("failed", True)
    route = gateway.catalog.resolve(model).routes[0]
    counted = sum(route.adapter.count_text_tokens(piece, route.target) for piece in pieces)
    assert generation.completion_tokens == counted
    # Without the upstream's count, the prompt as the hold counted it: its upper bound.
    request = ChatRequest(model=model, messages=HELLO, stream=True)
    held = route.adapter.prompt_token_bound(request, route.target)
    assert generation.prompt_tokens == (upstream_prompt_tokens or held)


def test_a_caller_hanging_up_mid_stream_closes_the_upstream_at_once(app, gateway, funded, scripted):
    scripted.script("/own", Reply("openai_chat_stream", repeat_event=3, pause=0.05))
    response = post(
        gateway, funded.key, {"model": "qwen3-8b", "messages": HELLO, "stream": True}, stream=True
    )
    lines = response.iter_lines()
    received = [line for line, _ in zip(lines, range(8), strict=False) if line]
    assert len(received) >= 3

    hung_up = time.monotonic()
    response.close()

    (exchange,) = scripted.exchanges
    assert exchange.answered.wait(5)
    assert exchange.client_closed_at is not None
    assert exchange.client_closed_at - hung_up < 1.0
    generation = assert_settled_once_at_its_price(
        gateway, wait_for_generation(app, funded.account_id), "qwen3-8b"
    )
    assert (generation.status, generation.estimated) == ("cancelled", True)
    assert generation.completion_tokens >= 3


def http_chunks(response):
    """The pieces of a chunked response body, as the gateway sent them."""
    return list(response.raw.read_chunked(decode_content=True))


def test_events_that_arrive_together_leave_in_one_http_chunk(gateway, funded, scripted):
    scripted.script("/third", Reply("openai_chat_stream", together=True))

    response = post(
        gateway, funded.key, {"model": "gpt-mini", "messages": HELLO, "stream": True}, stream=True
    )

    assert response.status_code == 200
    first, events, done = http_chunks(response)
    chunks = [
        json.loads(event[len(b"data: ") :]) for event in (first + events).split(b"\n\n") if event
    ]
    # The first event (the role) at once, then the nine words and the finish together;
    # then, after the settlement, the end.
    assert first.count(b"data: ") == 1
    assert len(chunks) == 11
    assert "".join(delivered_pieces(chunks)) == "Hello! How can I help you today?"
    assert done == b"data: [DONE]\n\n"


def test_a_token_reaches_the_caller_while_the_upstream_is_silent(gateway, funded, scripted):
    # The role, "Hello" and "!", then nothing for a while.
    silence = 1.5
    scripted.script(
        "/third", Reply("openai_chat_stream", stall_after_events=3, stall_seconds=silence)
    )
    response = post(
        gateway, funded.key, {"model": "gpt-mini", "messages": HELLO, "stream": True}, stream=True
    )
    pieces = response.raw.read_chunked(decode_content=True)
    received = b""
    while b'"!"' not in received:
        received += next(pieces)
    got_the_token = time.monotonic()

    rest = b"".join(pieces)

    assert time.monotonic() - got_the_token > silence / 2
    assert b'"Hello"' in received and b"[DONE]" in rest


RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_responses_reach_an_openai_compatible_upstream_as_chat(
    app, gateway, client, funded, scripted
):
    scripted.script("/third", Reply("openai_chat"))

    response = client.responses.create(
        model="gpt-mini",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        tools=[RESPONSES_TOOL, {"type": "web_search"}],
        tool_choice="auto",
        max_output_tokens=100,
        text={"format": {"type": "json_object"}},
    )  # fmt: skip

    assert response.model == "gpt-mini" and response.status == "completed"
    assert response.output_text == "The capital of France is Paris."
    sent = scripted.exchanges[0].json
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]  # fmt: skip
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {key: RESPONSES_TOOL[key] for key in ("name", "description", "parameters")},
        }
    ]
    assert (sent["tool_choice"], sent["max_tokens"]) == ("auto", 100)
    assert sent["response_format"] == {"type": "json_object"}
    generation = assert_settled_once_at_its_price(
        gateway, records(app, funded.account_id), "gpt-mini"
    )
    assert generation.api == "responses"
    assert Decimal(str(response.usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_responses_stream_parallel_calls_of_an_openai_compatible_upstream(
    app, gateway, client, funded, scripted
):
    scripted.script("/third", Reply("openai_chat_stream_tools", write_size=7))

    with client.responses.stream(
        model="gpt-mini", input="Paris and Rome?", tools=[RESPONSES_TOOL]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    calls = [(item.type, item.name, json.loads(item.arguments)) for item in final.output]
    assert calls == [
        ("function_call", "get_weather", {"city": "Paris"}),
        ("function_call", "get_weather", {"city": "Rome"}),
    ]
    assert [item.call_id for item in final.output] == [
        "call_0000000000000000000000a1",
        "call_0000000000000000000000b2",
    ]
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    )
    assert kinds[-1] == "response.completed"
    assert scripted.exchanges[0].json["stream_options"] == {"include_usage": True}
    generation = assert_settled_once_at_its_price(
        gateway, records(app, funded.account_id), "gpt-mini"
    )
    assert Decimal(str(final.usage.model_extra["cost"]["total_cost"])) == generation.cost


def test_responses_reach_anthropic_with_thinking_and_a_tool_call(
    app, gateway, client, funded, scripted
):
    scripted.script("/claude", Reply("anthropic_message_tool_use"))

    response = client.responses.create(
        model="claude-sonnet",
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        tools=[RESPONSES_TOOL],
        reasoning={"effort": "low"},
    )

    reasoning, message, call = response.output
    assert reasoning.summary[0].text.startswith("The user wants the weather")
    assert message.content[0].text == "I'll check the weather in Paris."
    assert (call.name, json.loads(call.arguments)["city"]) == ("get_weather", "Paris")
    assert call.call_id == "toolu_01A00000000000000000000a"
    sent = scripted.exchanges[0].json
    assert sent["system"] == "Be brief." and sent["thinking"]["type"] == "enabled"
    assert sent["tools"][0]["input_schema"] == RESPONSES_TOOL["parameters"]
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens) == (1436, 96)
    assert usage.input_tokens_details.cache_write_tokens == 1024
    generation = assert_settled_once_at_its_price(
        gateway, records(app, funded.account_id), "claude-sonnet"
    )
    assert generation.api == "responses"


def test_responses_stream_from_anthropic_thinking_then_text(gateway, client, scripted):
    scripted.script("/claude", Reply("anthropic_stream_thinking", write_size=11))

    with client.responses.stream(model="claude-sonnet", input="9.11 or 9.8?") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()

    reasoning, message = final.output
    assert (
        reasoning.summary[0].text
        == "Compare 9.11 and 9.8 as decimals: 9.80 > 9.11, so 9.8 is greater."
    )
    assert message.content[0].text == "9.8 is greater than 9.11."
    assert kinds.index("response.reasoning_summary_text.done") < kinds.index(
        "response.output_text.delta"
    )


def test_responses_stream_anthropic_tool_calls_after_text(gateway, client, scripted):
    scripted.script("/claude", Reply("anthropic_stream_tool_use", write_size=13))

    with client.responses.stream(
        model="claude-sonnet",
        input=[
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "type": "function_call",
                "call_id": "toolu_0",
                "name": "get_weather",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "toolu_0", "output": "unknown"},
        ],
        tools=[RESPONSES_TOOL],
    ) as stream:
        final = stream.get_final_response()

    assert [item.type for item in final.output] == ["message", "function_call", "function_call"]
    assert final.output[0].content[0].text == "I'll check both cities."
    assert [json.loads(item.arguments)["city"] for item in final.output[1:]] == ["Paris", "Rome"]
    sent = scripted.exchanges[0].json
    assert sent["messages"][1]["content"][0]["type"] == "tool_use"
    assert sent["messages"][2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_0",
        "content": "unknown",
    }
