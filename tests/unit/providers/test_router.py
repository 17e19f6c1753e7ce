"""Retries and failover over real adapters, against a replay server's faults."""

from __future__ import annotations

import contextvars
import time

import pytest

from app.observability.trace import RequestTrace
from app.providers import router
from app.providers.base import ChatRequest, Route, RouteTarget, UpstreamConfig
from app.providers.errors import (
    UpstreamError,
    UpstreamMisconfigured,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from app.providers.openai_compat import OpenAICompatAdapter
from app.providers.router import complete_on_routes, retry_delay, stream_on_routes
from tests.upstream_server import Reply, closed_port

TARGET = RouteTarget(upstream_model="upstream-model", max_output_tokens=512)
REQUEST = ChatRequest(model="m", messages=[{"role": "user", "content": "Hello"}])
STREAM = ChatRequest(model="m", messages=REQUEST.messages, stream=True)


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(router, "BACKOFF_BASE_SECONDS", 0.01)


def route(base_url, *, retries=1, read_timeout=5.0):
    config = UpstreamConfig(
        name=base_url.rsplit("/", 2)[-2],
        kind="openai",
        base_url=base_url,
        retries=retries,
        connect_timeout=1.0,
        read_timeout=read_timeout,
    )
    return Route(adapter=OpenAICompatAdapter(config), target=TARGET)


@pytest.fixture
def routes(replay_server):
    """Two live routes on the replay server, /first and /second."""
    return [route(f"{replay_server.url}/first/v1"), route(f"{replay_server.url}/second/v1")]


def dead_route():
    return route(f"http://127.0.0.1:{closed_port()}/dead/v1")


def test_a_failed_try_is_retried_on_the_same_route(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_500"), Reply("openai_chat"))

    completion = complete_on_routes(routes, REQUEST)

    assert completion.usage.prompt_tokens == 1247
    assert len(replay_server.exchanges_to("/first")) == 2
    assert replay_server.exchanges_to("/second") == []


def test_retry_after_is_honoured(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_429"), Reply("openai_chat"))

    complete_on_routes(routes, REQUEST)

    first, second = replay_server.exchanges_to("/first")
    assert second.received_at - first.received_at >= 1.0


def test_a_long_retry_after_moves_on_to_the_next_route_at_once(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_429_long"))
    replay_server.script("/second", Reply("openai_chat"))
    started = time.monotonic()

    complete_on_routes(routes, REQUEST)

    assert time.monotonic() - started < 1.0
    assert len(replay_server.exchanges_to("/first")) == 1


def test_a_refused_route_fails_over_to_the_next(replay_server):
    replay_server.script("/second", Reply("openai_chat"))

    complete_on_routes([dead_route(), route(f"{replay_server.url}/second/v1")], REQUEST)

    assert len(replay_server.exchanges_to("/second")) == 1


def test_a_misconfigured_route_is_not_retried_but_failed_over(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_401"))
    replay_server.script("/second", Reply("openai_chat"))

    complete_on_routes(routes, REQUEST)

    assert len(replay_server.exchanges_to("/first")) == 1
    with pytest.raises(UpstreamMisconfigured) as caught:
        replay_server.script("/first", Reply("openai_error_401"))
        complete_on_routes(routes[:1], REQUEST)
    assert caught.value.status == 502


def test_a_rejected_request_is_neither_retried_nor_failed_over(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_400"))

    with pytest.raises(UpstreamRejected):
        complete_on_routes(routes, REQUEST)

    assert len(replay_server.exchanges) == 1


def test_a_hanging_route_times_out_then_fails_over(replay_server):
    replay_server.script("/first", Reply(hang=True))
    replay_server.script("/second", Reply("openai_chat"))
    slow = route(f"{replay_server.url}/first/v1", retries=0, read_timeout=0.3)

    complete_on_routes([slow, route(f"{replay_server.url}/second/v1")], REQUEST)

    assert len(replay_server.exchanges) == 2


def test_exhausted_routes_are_unavailable(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_500"), Reply("openai_error_500"))
    replay_server.script("/second", Reply("openai_error_429"), Reply("openai_error_500"))

    with pytest.raises(UpstreamUnavailable) as caught:
        complete_on_routes(routes, REQUEST)

    assert caught.value.status == 503
    assert len(replay_server.exchanges) == 4


def test_one_exhausted_route_gives_its_own_error(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_500"), Reply("openai_error_500"))

    with pytest.raises(UpstreamError) as caught:
        complete_on_routes(routes[:1], REQUEST)

    assert (type(caught.value), caught.value.status) == (UpstreamError, 502)


def test_a_stream_fails_over_before_its_first_chunk(routes, replay_server):
    replay_server.script(
        "/first",
        Reply("openai_error_500"),
        Reply(transcript="openai_chat_stream", close_after_events=0),
    )
    replay_server.script("/second", Reply("openai_chat_stream"))

    chunks = list(stream_on_routes(routes, STREAM))

    assert chunks[-1].usage.completion_tokens == 10
    assert len(replay_server.exchanges_to("/second")) == 1


def test_a_stream_that_started_is_not_retried_elsewhere(routes, replay_server):
    replay_server.script("/first", Reply("openai_chat_stream", close_after_events=3))
    replay_server.script("/second", Reply("openai_chat_stream"))
    received = []

    with pytest.raises(UpstreamError):
        for chunk in stream_on_routes(routes, STREAM):
            received.append(chunk)

    assert len(received) == 3
    assert replay_server.exchanges_to("/second") == []


@pytest.mark.parametrize(
    ("error", "delay"),
    [
        (UpstreamMisconfigured(), None),
        (UpstreamUnavailable(retry_after=2.5), 2.5),
        (UpstreamUnavailable(retry_after=router.MAX_RETRY_AFTER_SECONDS + 1), None),
        (UpstreamTimeout(), "backoff"),
    ],
)
def test_retry_delay(error, delay):
    result = retry_delay(error, 1)

    if delay == "backoff":
        assert 0 < result <= router.BACKOFF_CAP_SECONDS
    else:
        assert result == delay


def test_every_call_is_traced_with_how_it_ended(routes, replay_server):
    replay_server.script("/first", Reply("openai_error_500"), Reply("openai_error_429"))
    replay_server.script("/second", Reply("openai_chat"))
    trace = RequestTrace(request_id="r")

    # A fresh context: no request is being served, whatever earlier tests ran in this thread.
    contextvars.Context().run(complete_on_routes, routes, REQUEST, trace)

    assert [(a.upstream, a.outcome) for a in trace.attempts] == [
        ("first", "5xx"),
        ("first", "failed_over"),
        ("second", "ok"),
    ]
    assert trace.upstream_wait >= sum(a.seconds for a in trace.attempts)
    assert replay_server.exchanges[0].headers.get("x-request-id") is None


def test_a_cooling_route_is_skipped_without_a_call(replay_server):
    first = route(f"{replay_server.url}/first/v1", retries=0)
    second = route(f"{replay_server.url}/second/v1")
    replay_server.script("/first", *[Reply("openai_error_500")] * 3)
    replay_server.script("/second", *[Reply("openai_chat")] * 4)
    traces = [RequestTrace(request_id=str(i)) for i in range(4)]

    for trace in traces:
        complete_on_routes([first, second], REQUEST, trace)

    assert len(replay_server.exchanges_to("/first")) == 3
    assert [a.outcome for a in traces[3].attempts] == ["skipped", "ok"]
