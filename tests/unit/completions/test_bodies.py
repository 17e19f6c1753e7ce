"""Chat Completions' wire bodies of a generation's chunks and its end."""

from __future__ import annotations

from decimal import Decimal
from types import SimpleNamespace

from app.completions.bodies import chunk_bodies
from app.generations.lifecycle import StreamEnd
from app.providers.base import ChatRequest, Chunk, Usage, fingerprint_of

USAGE = Usage(prompt_tokens=9, completion_tokens=2)


def generation(include_usage: bool) -> SimpleNamespace:
    request = ChatRequest(model="m", messages=[], stream=True, include_usage=include_usage)
    return SimpleNamespace(
        id="chatcmpl-1", created=1, model=SimpleNamespace(id="m"), request=request
    )


def stream(*items):
    closed = []

    def generate():
        try:
            yield from items
        finally:
            closed.append(True)

    return generate(), closed


def choice(text: str) -> list[dict]:
    return [{"index": 0, "delta": {"content": text}, "finish_reason": None}]


def test_chunks_become_chat_chunks_and_flush_points_pass_through():
    items, closed = stream(
        Chunk(choices=choice("a"), system_fingerprint="fp_up"),
        None,
        Chunk(choices=choice("b")),
        StreamEnd(USAGE, Decimal("0.1"), "stop"),
    )

    bodies = list(chunk_bodies(generation(include_usage=False), items))

    assert [body if body is None else body["choices"] for body in bodies] == [
        choice("a"),
        None,
        choice("b"),
    ]
    # The last fingerprint the upstream sent stays; no usage chunk was asked for.
    assert {body["system_fingerprint"] for body in bodies if body} == {"fp_up"}
    assert closed == [True]


def test_the_end_becomes_a_usage_chunk_with_its_cost_when_asked_for():
    items, _ = stream(StreamEnd(USAGE, Decimal("0.1"), "stop"))

    (body,) = list(chunk_bodies(generation(include_usage=True), items))

    assert body["choices"] == [] and body["object"] == "chat.completion.chunk"
    assert body["usage"]["total_tokens"] == 11
    assert body["usage"]["cost"] == {"total_cost": Decimal("0.1")}
    assert body["system_fingerprint"] == fingerprint_of("m")


def test_closing_the_bodies_closes_the_generations_stream():
    items, closed = stream(Chunk(choices=choice("a")), Chunk(choices=choice("b")))
    bodies = chunk_bodies(generation(include_usage=False), items)
    next(bodies)

    bodies.close()

    assert closed == [True]
