"""Requests passed through in an upstream's own wire format: held, relayed, settled once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal

import pytest

from app.auth.keys import find_caller
from app.catalog.pricing import cost_of
from app.catalog.registry import current_catalog
from app.credits.models import LedgerEntry
from app.extensions import db
from app.generations import lifecycle
from app.generations.metering import Outcome
from app.generations.models import Generation
from app.providers.base import (
    Adapter,
    ChatRequest,
    NativeAnswer,
    NativeCall,
    Route,
    RouteTarget,
    UpstreamConfig,
    Usage,
)
from tests.factories import AccountFactory

HELLO = [{"role": "user", "content": "Hello world"}]
EVENTS = [b'{"text": "one two"}\n', b'{"text": "three"}\n', b'{"usage": [11, 3]}\n']


class Native(Adapter):
    """An upstream that speaks the test's own protocol, "lines": a JSON object a line."""

    kind = "native"
    native_apis = frozenset({"lines"})

    def __init__(self) -> None:
        super().__init__(UpstreamConfig(name="native", kind=self.kind))
        self.calls: list[NativeCall] = []

    def complete(self, request, target):  # pragma: no cover - a native route is relayed
        raise AssertionError("translated")

    def stream(self, request, target):  # pragma: no cover - a native route is relayed
        raise AssertionError("translated")

    def count_prompt_tokens(self, request, target, *, limit=None) -> int:
        return 11

    def count_text_tokens(self, text: str, target) -> int:
        return len(text.split())

    def relay(self, call: NativeCall, target: RouteTarget) -> NativeAnswer:
        self.calls.append(call)
        body = json.dumps({"model": target.upstream_model, "usage": [11, 5]}).encode()
        return NativeAnswer(body=body, decoded=json.loads(body))

    def relay_stream(self, call: NativeCall, target: RouteTarget) -> Iterator[bytes]:
        self.calls.append(call)
        yield from EVENTS


class LinesMeter:
    """Reads the "lines" protocol: text delivered, usage at the end."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.complete = False
        self.finish_reason = None
        self.failed = False
        self.ended = False
        self.words = 0
        self.changed_since_counted = False

    def observe(self, data: bytes) -> bool:
        event = json.loads(data)
        if "error" in event:
            self.failed = True
            return False
        if "usage" in event:
            self.usage = Usage(prompt_tokens=event["usage"][0], completion_tokens=event["usage"][1])
            self.ended = True
            return False
        self.words += len(event["text"].split())
        self.changed_since_counted = True
        return True

    def usage_so_far(self) -> Usage:
        self.changed_since_counted = False
        return Usage(prompt_tokens=11, completion_tokens=self.words, estimated=True)

    def final_usage(self) -> Usage:
        return self.usage if self.complete and self.usage else self.usage_so_far()


@pytest.fixture
def native_model(app_context):
    adapter = Native()
    model = current_catalog().resolve("dev-chat-mini")
    route = Route(adapter=adapter, target=RouteTarget(upstream_model="upstream-name"))
    return replace(model, routes=(route,)), adapter


def start(model, stream: bool = False):
    _, issued = AccountFactory.with_key(credits=Decimal("1"))
    return lifecycle.start_generation(
        caller=find_caller(issued.value),
        model=model,
        request=ChatRequest(model=model.id, messages=HELLO, stream=stream),
        hold_ttl_seconds=60,
    )


def charged(generation_id: str) -> list[Decimal]:
    return list(
        db.session.scalars(
            db.select(LedgerEntry.amount).where(LedgerEntry.generation_id == generation_id)
        )
    )


def test_only_routes_that_speak_the_protocol_pass_it_through(native_model):
    model, _ = native_model
    translated = current_catalog().resolve("dev-chat-mini")

    assert lifecycle.native_routes(model, "lines") == model.routes
    assert lifecycle.native_routes(model, "other") == ()
    assert lifecycle.native_routes(translated, "lines") == ()


def test_a_whole_answer_passed_through_is_charged_the_usage_its_door_reads(native_model):
    model, adapter = native_model
    generation = start(model)
    call = NativeCall(api="lines", body={"model": model.id}, headers={"x-version": "1"})

    answer, usage, cost = lifecycle.relay_generation(
        generation, call, lambda body: Outcome(Usage(*body["usage"]), "length")
    )

    assert adapter.calls == [call]
    assert answer.decoded["model"] == "upstream-name"
    assert usage == Usage(prompt_tokens=11, completion_tokens=5)
    assert cost == cost_of(usage, model.pricing) and charged(generation.id) == [-cost]
    record = db.session.get(Generation, generation.id)
    assert (record.status, record.finish_reason) == ("completed", "length")


def test_a_whole_answer_its_door_reads_as_failed_is_recorded_failed_and_charged(native_model):
    model, _ = native_model
    generation = start(model)
    call = NativeCall(api="lines", body={"model": model.id})

    _, usage, cost = lifecycle.relay_generation(
        generation, call, lambda body: Outcome(Usage(*body["usage"]), failed=True)
    )

    assert cost == cost_of(usage, model.pricing) > 0 and charged(generation.id) == [-cost]
    assert db.session.get(Generation, generation.id).status == "failed"


def test_a_stream_that_says_it_failed_is_recorded_failed_and_charged_what_it_delivered(
    native_model,
):
    model, adapter = native_model
    adapter_events = [EVENTS[0], b'{"error": "overloaded"}\n']
    generation = start(model, stream=True)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tests.unit.generations.test_relay.EVENTS", adapter_events)
        items = list(
            lifecycle.relay_stream(generation, NativeCall(api="lines", body={}), LinesMeter())
        )

    end = items[-1]
    assert end.usage == Usage(prompt_tokens=11, completion_tokens=2, estimated=True)
    assert charged(generation.id) == [-end.cost] and end.cost > 0
    assert db.session.get(Generation, generation.id).status == "failed"


def test_a_stream_passed_through_yields_the_upstreams_bytes_then_settles(native_model):
    model, _ = native_model
    generation = start(model, stream=True)

    items = list(lifecycle.relay_stream(generation, NativeCall(api="lines", body={}), LinesMeter()))

    assert [item for item in items if isinstance(item, bytes)] == EVENTS
    assert items[1] is None, "every read is flushed as it came"
    end = items[-1]
    assert end.usage == Usage(prompt_tokens=11, completion_tokens=3)
    assert charged(generation.id) == [-end.cost]
    assert db.session.get(Generation, generation.id).status == "completed"


def test_a_stream_passed_through_its_caller_leaves_is_charged_what_it_delivered(native_model):
    model, _ = native_model
    generation = start(model, stream=True)
    stream = lifecycle.relay_stream(generation, NativeCall(api="lines", body={}), LinesMeter())
    next(stream)

    stream.close()

    record = db.session.get(Generation, generation.id)
    assert (record.status, record.completion_tokens, record.estimated) == ("cancelled", 2, True)
    assert charged(generation.id) == [-record.cost]
