"""A stream's meter: what it delivered, counted as it goes, and the usage it is billed."""

from __future__ import annotations

from types import SimpleNamespace

from app.generations.metering import StreamMeter
from app.providers.base import (
    Adapter,
    ChatRequest,
    Chunk,
    Route,
    RouteTarget,
    UpstreamConfig,
    Usage,
)


class Words(Adapter):
    """Counts a word a token; the prompt is what its request says, counted once each time."""

    kind = "words"

    def __init__(self) -> None:
        super().__init__(UpstreamConfig(name="words", kind=self.kind))
        self.prompt_counts = 0

    def complete(self, request, target):  # pragma: no cover - never called
        raise NotImplementedError

    def stream(self, request, target):  # pragma: no cover - never called
        raise NotImplementedError

    def count_prompt_tokens(self, request, target, *, limit=None) -> int:
        self.prompt_counts += 1
        return 7

    def count_text_tokens(self, text: str, target) -> int:
        return len(text.split())


def meter(*, prompt_tokens: int = 20, prompt_exact: bool = True) -> tuple[StreamMeter, Words]:
    adapter = Words()
    route = Route(adapter=adapter, target=RouteTarget(upstream_model="m"))
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    generation = SimpleNamespace(
        model=SimpleNamespace(routes=[route]),
        request=request,
        prompt_tokens=prompt_tokens,
        prompt_tokens_exact=prompt_exact,
    )
    return StreamMeter(generation), adapter


def delta(text: str = "", finish: str | None = None, **fields: object) -> Chunk:
    return Chunk(
        choices=[{"index": 0, "delta": {"content": text, **fields}, "finish_reason": finish}]
    )


def test_what_was_delivered_is_counted_as_it_goes():
    stream, _ = meter()
    stream.observe(delta("one two"))
    assert stream.delivered_since_counted
    assert stream.usage_so_far() == Usage(prompt_tokens=20, completion_tokens=2, estimated=True)
    assert not stream.delivered_since_counted

    stream.observe(delta("three", reasoning="four five"))
    stream.observe(
        delta(tool_calls=[{"index": 0, "function": {"name": "f", "arguments": "six seven"}}])
    )

    assert stream.usage_so_far().completion_tokens == 2 + 3 + 3


def test_the_upstreams_usage_is_billed_when_the_stream_ends():
    stream, _ = meter()
    stream.observe(delta("one", finish="stop"))
    stream.usage = Usage(prompt_tokens=11, completion_tokens=40)
    stream.complete = True

    assert stream.final_usage() == Usage(prompt_tokens=11, completion_tokens=40)
    assert stream.finish_reason == "stop"


def test_a_stream_cut_short_is_billed_what_it_delivered_with_the_upstreams_prompt():
    stream, _ = meter()
    # Anthropic sends the prompt's count first, at message_start.
    stream.usage = Usage(prompt_tokens=11)
    stream.observe(delta("one two three"))

    assert stream.final_usage() == Usage(prompt_tokens=11, completion_tokens=3, estimated=True)


def test_a_prompt_held_on_a_bound_is_billed_at_the_bound_never_counted_lower():
    stream, adapter = meter(prompt_tokens=400, prompt_exact=False)
    stream.observe(delta("one"))
    first = stream.usage_so_far()
    stream.observe(delta("two"))
    second = stream.usage_so_far()

    assert (first.prompt_tokens, second.prompt_tokens) == (400, 400)
    assert adapter.prompt_counts == 0


def test_nothing_delivered_bills_nothing():
    stream, _ = meter()
    stream.observe(delta(""))

    assert stream.final_usage() == Usage()
