"""OpenAICompatAdapter against a local server replaying recorded OpenAI-compatible transcripts."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app.providers.base import ChatRequest, NativeCall, RouteTarget, UpstreamConfig
from app.providers.errors import (
    UpstreamError,
    UpstreamMisconfigured,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from app.providers.openai_compat import OpenAICompatAdapter
from app.providers.transport import open_pool, received_chunks
from tests.upstream_server import Reply, answered_chunks, closed_port, load_transcript

HELLO = [{"role": "user", "content": "Hello"}]
TARGET = RouteTarget(
    upstream_model="gpt-4o-mini-2024-07-18",
    capabilities=frozenset({"tools", "reasoning"}),
    extra_params=frozenset({"top_k"}),
    max_output_tokens=1024,
)
KEY = "sk-third-test-secret"


def make_adapter(base_url, **config):
    config.setdefault("read_timeout", 5.0)
    return OpenAICompatAdapter(
        UpstreamConfig(name="third", kind="openai", base_url=base_url, **config)
    )


@pytest.fixture
def adapter(replay_server, monkeypatch):
    monkeypatch.setenv("THIRD_API_KEY", KEY)
    return make_adapter(f"{replay_server.url}/third/v1", api_key_env="THIRD_API_KEY")


def chat(**fields):
    fields.setdefault("messages", HELLO)
    return ChatRequest(model="mini", **fields)


def streamed_text(chunks, key="content"):
    return "".join(choice["delta"].get(key) or "" for chunk in chunks for choice in chunk.choices)


def stream_of(url):
    """POST an empty JSON object to ``url`` through the adapters' transport; body left unread."""
    return open_pool(1).post(url, b"{}", {"Content-Type": "application/json"}, (5.0, 5.0))


def collect_until_error(chunks):
    received = []
    with pytest.raises(UpstreamError) as caught:
        for chunk in chunks:
            received.append(chunk)
    return received, caught.value


def test_whole_answer_keeps_the_contract_fields_and_the_upstream_usage(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat"))

    completion = adapter.complete(chat(params={"temperature": 0.2}), TARGET)

    assert completion.choices == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "The capital of France is Paris.",
                "refusal": None,
            },
            "finish_reason": "stop",
            "logprobs": None,
        }
    ]
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (1247, 8, 1152)
    assert not usage.estimated
    assert completion.system_fingerprint == "fp_560af6e559"


def test_request_carries_the_upstream_model_the_key_and_only_allowed_extras(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat"))
    request = chat(
        params={"temperature": 0.2, "max_tokens": 50, "user": "u-1"},
        extra={"top_k": 40, "repetition_penalty": 1.1},
    )

    adapter.complete(request, TARGET)

    (exchange,) = replay_server.exchanges
    assert (exchange.method, exchange.path) == ("POST", "/third/v1/chat/completions")
    assert exchange.headers["authorization"] == f"Bearer {KEY}"
    assert exchange.headers["content-type"] == "application/json"
    assert exchange.json == {
        "model": "gpt-4o-mini-2024-07-18",
        "messages": HELLO,
        "temperature": 0.2,
        "max_tokens": 50,
        "user": "u-1",
        "top_k": 40,
    }


def test_an_upstream_without_a_key_gets_no_authorization(replay_server):
    replay_server.script("/own", Reply("openai_chat"))

    make_adapter(f"{replay_server.url}/own/v1").complete(chat(), TARGET)

    assert "authorization" not in replay_server.exchanges[0].headers


def test_a_missing_key_variable_is_the_operators_error_and_sends_nothing(
    replay_server, monkeypatch
):
    monkeypatch.delenv("UNSET_KEY", raising=False)
    adapter = make_adapter(f"{replay_server.url}/own/v1", api_key_env="UNSET_KEY")

    with pytest.raises(UpstreamMisconfigured) as caught:
        adapter.complete(chat(), TARGET)

    assert "UNSET_KEY" not in caught.value.message
    assert replay_server.exchanges == []


def test_the_key_is_read_when_a_request_needs_it(replay_server, monkeypatch):
    monkeypatch.delenv("LATE_KEY", raising=False)
    adapter = make_adapter(f"{replay_server.url}/own/v1", api_key_env="LATE_KEY")
    monkeypatch.setenv("LATE_KEY", "sk-set-after-start")
    replay_server.script("/own", Reply("openai_chat"))

    adapter.complete(chat(), TARGET)

    assert replay_server.exchanges[0].headers["authorization"] == "Bearer sk-set-after-start"


@pytest.mark.parametrize(
    "reply",
    [
        Reply("openai_chat_stream"),
        Reply("openai_chat_stream", write_size=1),
        Reply("openai_chat_stream", write_size=7, pause=0.001),
    ],
    ids=["event-per-write", "byte-per-write", "7-bytes-per-write"],
)
def test_stream_relays_deltas_then_usage_whatever_the_tcp_writes(adapter, replay_server, reply):
    replay_server.script("/third", reply)

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))

    assert streamed_text(chunks) == "Hello! How can I help you today?"
    assert chunks[0].choices[0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2].choices[0]["finish_reason"] == "stop"
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (19, 10)
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_stream_always_asks_for_usage(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat_stream"))

    list(adapter.stream(chat(stream=True, include_usage=False), TARGET))

    body = replay_server.exchanges[0].json
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})


def test_streamed_chunks_carry_nothing_of_the_upstream(adapter, replay_server):
    replay_server.script("/third", Reply("openrouter_chat_stream_reasoning"))

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))

    for chunk in chunks:
        for choice in chunk.choices:
            assert set(choice) == {"index", "delta", "finish_reason"}
            assert "DeepInfra" not in str(choice) and "deepseek" not in str(choice)
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens) == (14, 31, 24)


def test_streamed_tool_calls_keep_their_indexes(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat_stream_tools", write_size=11))

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))

    calls: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice["delta"].get("tool_calls", ()):
                call = calls.setdefault(delta["index"], {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.get("id") or call["id"]
                call["name"] += delta.get("function", {}).get("name") or ""
                call["arguments"] += delta.get("function", {}).get("arguments") or ""
    assert calls == {
        0: {
            "id": "call_0000000000000000000000a1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        1: {
            "id": "call_0000000000000000000000b2",
            "name": "get_weather",
            "arguments": '{"city": "Rome"}',
        },
    }
    assert chunks[-2].choices[0]["finish_reason"] == "tool_calls"


def test_vllm_reasoning_content_is_renamed_reasoning(adapter, replay_server):
    replay_server.script(
        "/third", Reply("vllm_chat_stream_reasoning"), Reply("vllm_chat_reasoning")
    )

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))
    completion = adapter.complete(chat(), TARGET)

    reasoning = streamed_text(chunks, "reasoning")
    assert reasoning.startswith("Okay, the user asks which is greater")
    assert streamed_text(chunks) == "\n\n9.8 is greater than 9.11."
    assert not any("reasoning_content" in c["delta"] for k in chunks for c in k.choices)
    message = completion.choices[0]["message"]
    assert message["reasoning"] == reasoning
    assert "reasoning_content" not in message and "tool_calls" not in message
    assert chunks[-1].usage.completion_tokens == completion.usage.completion_tokens == 42


@pytest.mark.parametrize(
    ("stop", "named"),
    [
        (["STOP", "END"], "END"),
        ("END", "END"),
        # A stop_reason that is not one of the caller's sequences is not taken for one.
        (["STOP"], None),
        (None, None),
    ],
)
def test_vllms_stop_reason_names_the_stop_sequence_whole_and_streamed(
    adapter, replay_server, stop, named
):
    replay_server.script(
        "/third", Reply("vllm_chat_stream_stop_sequence"), Reply("vllm_chat_stop_sequence")
    )
    params = {} if stop is None else {"stop": stop}

    chunks = list(adapter.stream(chat(stream=True, params=params), TARGET))
    completion = adapter.complete(chat(params=params), TARGET)

    assert completion.stop_sequence == named
    assert [chunk.stop_sequence for chunk in chunks if chunk.stop_sequence] == [named] * bool(named)
    # Nothing of it reaches the contract's choices.
    assert "stop_reason" not in completion.choices[0]


def test_an_answer_that_names_no_stop_string_names_no_stop_sequence(adapter, replay_server):
    replay_server.script(
        "/third", Reply("vllm_chat_stream_reasoning"), Reply("vllm_chat_reasoning")
    )
    params = {"stop": ["END"]}

    chunks = list(adapter.stream(chat(stream=True, params=params), TARGET))
    completion = adapter.complete(chat(params=params), TARGET)

    assert completion.stop_sequence is None
    assert all(chunk.stop_sequence is None for chunk in chunks)


def test_crlf_stream_with_pings_and_no_usage_ends_without_a_usage_chunk(adapter, replay_server):
    replay_server.script(
        "/third", Reply("sse_starlette_chat_stream_no_usage", write_size=5, pause=0.0005)
    )

    chunks = answered_chunks(adapter.stream(chat(stream=True), TARGET))

    assert streamed_text(chunks).startswith("Sure, here is a haiku:\nAutumn moonlight")
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0]["finish_reason"] == "stop"


def test_whole_answer_without_usage_is_counted_and_marked_estimated(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat_no_usage"))
    request = chat()

    completion = adapter.complete(request, TARGET)

    usage = completion.usage
    assert usage.estimated
    assert usage.prompt_tokens == adapter.count_prompt_tokens(request, TARGET)
    assert usage.completion_tokens == adapter.count_text_tokens(
        "The capital of France is Paris.", TARGET
    )


def test_malformed_json_mid_stream_fails_after_what_was_delivered(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat_stream_malformed"))

    received, error = collect_until_error(adapter.stream(chat(stream=True), TARGET))

    assert streamed_text(received) == "Hello!"
    assert error.message == "The model's upstream sent a malformed event."


def test_an_error_event_mid_stream_fails_without_naming_the_provider(adapter, replay_server):
    replay_server.script("/third", Reply("openrouter_chat_stream_error"))

    received, error = collect_until_error(adapter.stream(chat(stream=True), TARGET))

    assert streamed_text(received) == "Once upon"
    assert "DeepInfra" not in error.message and "upstream connect" not in error.message


def test_a_connection_dropped_mid_stream_fails_after_what_was_delivered(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat_stream", close_after_events=4))

    received, error = collect_until_error(adapter.stream(chat(stream=True), TARGET))

    assert streamed_text(received) == "Hello! How"
    assert type(error) is UpstreamError


def test_an_upstream_gone_silent_mid_stream_times_out(replay_server):
    adapter = make_adapter(f"{replay_server.url}/own/v1", read_timeout=0.3)
    replay_server.script("/own", Reply("openai_chat_stream", stall_after_events=3))

    received, error = collect_until_error(adapter.stream(chat(stream=True), TARGET))

    assert streamed_text(received) == "Hello!"
    assert isinstance(error, UpstreamTimeout)


@pytest.mark.parametrize(
    ("transcript", "error_class", "status", "retry_after"),
    [
        ("openai_error_401", UpstreamMisconfigured, 502, None),
        ("openai_error_429", UpstreamUnavailable, 503, 1.0),
        ("openai_error_429_long", UpstreamUnavailable, 503, 60.0),
        ("openai_error_500", UpstreamError, 502, None),
        ("nginx_redirect_301", UpstreamMisconfigured, 502, None),
    ],
)
def test_error_statuses_map_to_the_gateways_errors_revealing_nothing(
    adapter, replay_server, transcript, error_class, status, retry_after
):
    replay_server.script("/third", Reply(transcript))

    with pytest.raises(UpstreamError) as caught:
        adapter.complete(chat(), TARGET)

    error = caught.value
    assert (type(error), error.status, error.retry_after) == (error_class, status, retry_after)
    for secret in ("sk-", "api key", "127.0.0.1", "openai", "gpt-4o", "third", "example.com"):
        assert secret not in error.message.lower()
    # A redirect is not followed: the one request went where the catalog says.
    assert [exchange.path for exchange in replay_server.exchanges] == ["/third/v1/chat/completions"]


@pytest.mark.parametrize(
    ("transcript", "message", "param"),
    [
        ("openai_error_400", "'messages' must contain the word 'json' in some form", "messages"),
        ("vllm_error_400", "This model's maximum context length is 32768 tokens.", None),
    ],
)
def test_a_rejected_request_passes_the_upstream_message_on(
    adapter, replay_server, transcript, message, param
):
    replay_server.script("/third", Reply(transcript))

    with pytest.raises(UpstreamRejected) as caught:
        adapter.complete(chat(), TARGET)

    error = caught.value
    assert (error.status, error.type) == (400, "invalid_request_error")
    assert error.message.startswith(message)
    assert error.param == param


def test_a_refused_connection_is_unavailable():
    adapter = make_adapter(f"http://127.0.0.1:{closed_port()}/v1", connect_timeout=1.0)

    with pytest.raises(UpstreamUnavailable):
        adapter.complete(chat(), TARGET)


def test_an_upstream_that_never_answers_times_out(replay_server):
    adapter = make_adapter(f"{replay_server.url}/own/v1", read_timeout=0.3)
    replay_server.script("/own", Reply(hang=True))
    started = time.monotonic()

    with pytest.raises(UpstreamTimeout):
        adapter.complete(chat(), TARGET)

    assert time.monotonic() - started < 2


def test_closing_a_stream_closes_the_upstream_connection_at_once(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat_stream", repeat_event=3, pause=0.02))
    chunks = adapter.stream(chat(stream=True), TARGET)
    for _ in range(5):
        next(chunks)

    closed = time.monotonic()
    chunks.close()

    (exchange,) = replay_server.exchanges
    assert exchange.answered.wait(2)
    assert exchange.client_closed_at is not None
    assert exchange.client_closed_at - closed < 0.5


def test_connections_are_kept_alive_and_reused(adapter, replay_server):
    replay_server.script(
        "/third", Reply("openai_chat"), Reply("openai_chat_stream"), Reply("openai_chat")
    )

    adapter.complete(chat(), TARGET)
    list(adapter.stream(chat(stream=True), TARGET))
    adapter.complete(chat(), TARGET)

    assert len({exchange.connection for exchange in replay_server.exchanges}) == 1


def test_cookies_an_upstream_sets_are_not_sent_back(adapter, replay_server):
    # The transcript's nginx sets a sticky-session cookie for its host.
    replay_server.script("/third", Reply("vllm_chat_reasoning"), Reply("vllm_chat_reasoning"))

    adapter.complete(chat(), TARGET)
    adapter.complete(chat(), TARGET)

    assert "set-cookie: srv_id=" in load_transcript("vllm_chat_reasoning")[0].decode()
    assert all("cookie" not in exchange.headers for exchange in replay_server.exchanges)


def test_the_upstreams_system_fingerprint_is_kept(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat"), Reply("openai_chat_stream"))

    completion = adapter.complete(chat(), TARGET)
    chunks = list(adapter.stream(chat(stream=True), TARGET))

    assert completion.system_fingerprint == "fp_560af6e559"
    assert {chunk.system_fingerprint for chunk in chunks} == {"fp_560af6e559"}


def test_an_upstream_without_a_system_fingerprint_gets_one_of_the_gateway(adapter, replay_server):
    replay_server.script("/third", Reply("sse_starlette_chat_stream_no_usage"))

    chunks = list(adapter.stream(chat(stream=True), TARGET))

    fingerprints = {chunk.system_fingerprint for chunk in chunks}
    assert len(fingerprints) == 1
    (fingerprint,) = fingerprints
    assert isinstance(fingerprint, str) and fingerprint.startswith("fp_")


def test_the_events_that_arrived_together_are_one_read(replay_server):
    replay_server.script("/third", Reply("openai_chat_stream", together=True))
    response = stream_of(f"{replay_server.url}/third/v1/chat/completions")

    assert list(received_chunks(response)) == [load_transcript("openai_chat_stream")[1]]


class GzipStream(BaseHTTPRequestHandler):
    """Answers with a compressed event stream, in HTTP chunks."""

    protocol_version = "HTTP/1.1"
    events = load_transcript("openai_chat_stream")[1]

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        body = gzip.compress(self.events)
        self.send_response(200)
        for name, value in (
            ("Content-Type", "text/event-stream"),
            ("Content-Encoding", "gzip"),
            ("Transfer-Encoding", "chunked"),
        ):
            self.send_header(name, value)
        self.end_headers()
        for start in range(0, len(body), 64):
            piece = body[start : start + 64]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        """Keep the test's output quiet."""


def test_an_encoded_stream_is_read_decoded():
    server = ThreadingHTTPServer(("127.0.0.1", 0), GzipStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
        received = b"".join(received_chunks(stream_of(url)))
    finally:
        server.shutdown()
        server.server_close()

    assert received == GzipStream.events


class CraftedChunks(BaseHTTPRequestHandler):
    """Streams its events in HTTP chunks framed every way the protocol allows, then again."""

    protocol_version = "HTTP/1.1"
    events = load_transcript("openai_chat_stream")[1]
    # A chunk larger than a connection's read buffer, between two events in the middle.
    big_comment = b": " + b"x" * 20_000 + b"\n\n"
    half = events.index(b"\n\n", len(events) // 2) + 2

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        pieces = [self.events[: self.half], self.big_comment, self.events[self.half :]]
        framed = b"".join(
            b"%X;ext=%d\r\n%s\r\n" % (len(piece), index, piece)
            for index, piece in enumerate(pieces)
        )
        framed += b"0\r\nX-Trailer: yes\r\n\r\n"
        # Written so that size lines, data and CRLFs are cut between writes.
        for start in range(0, len(framed), 1_000):
            self.wfile.write(framed[start : start + 1_000])
            self.wfile.flush()
            time.sleep(0.001)

    def log_message(self, *args: object) -> None:
        """Keep the test's output quiet."""


def test_chunk_extensions_large_chunks_and_trailers_are_read_and_the_connection_kept():
    server = ThreadingHTTPServer(("127.0.0.1", 0), CraftedChunks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    adapter = make_adapter(f"http://127.0.0.1:{server.server_address[1]}/v1")
    try:
        chunks = [list(adapter.stream(chat(stream=True), TARGET)) for _ in range(2)]
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
        received = b"".join(received_chunks(stream_of(url)))
    finally:
        server.shutdown()
        server.server_close()

    events, half = CraftedChunks.events, CraftedChunks.half
    assert received == events[:half] + CraftedChunks.big_comment + events[half:]
    for answer in chunks:
        assert streamed_text(answer) == "Hello! How can I help you today?"
        assert answer[-1].usage is not None
    # Each stream's end, trailer included, was read: the second call reused the connection.
    assert adapter.pool.idle_connections, "no pooled connection"
    assert len(adapter.pool.origins) == 1
    assert adapter.pool.connections_opened == 1


def test_chunks_say_more_until_their_read_ends(adapter, replay_server):
    # Events 0-11 (the role, nine words, the finish, the usage) in one write, then [DONE].
    reply = Reply("openai_chat_stream", together=True, stall_after_events=12, stall_seconds=0.2)
    replay_server.script("/third", reply)

    chunks = list(adapter.stream(chat(stream=True), TARGET))

    assert [chunk.more for chunk in chunks] == [True] * 11 + [False]
    # The usage event ended the read: its chunk, the last, comes as it came.
    assert (chunks[-1].choices, chunks[-1].usage is not None) == ([], True)
    assert streamed_text(chunks) == "Hello! How can I help you today?"


def test_the_last_chunk_before_the_upstream_goes_silent_says_no_more(adapter, replay_server):
    reply = Reply("openai_chat_stream", stall_after_events=3, stall_seconds=0.3)
    replay_server.script("/third", reply)

    chunks = list(adapter.stream(chat(stream=True), TARGET))

    assert streamed_text(chunks[:3]) == "Hello!"
    assert chunks[2].more is False


def test_a_responses_request_passes_through_to_the_upstreams_responses(adapter, replay_server):
    replay_server.script("/third", Reply("openai_chat"))
    body = {"model": "public", "input": "Hi", "store": False, "include": ["x"]}

    answer = adapter.relay(
        NativeCall(api="responses", body=body), RouteTarget(upstream_model="gpt-test")
    )

    (exchange,) = replay_server.exchanges
    assert exchange.path.endswith("/v1/responses")
    assert exchange.json == {**body, "model": "gpt-test"}
    assert answer.body == load_transcript("openai_chat")[1]
