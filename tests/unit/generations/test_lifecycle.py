"""A generation's life in the core: held at its worst case, run, settled once, recorded."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import select

from app.auth.keys import find_caller
from app.catalog.pricing import cost_of
from app.catalog.registry import current_catalog
from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from app.generations import lifecycle
from app.generations.models import RESPONSES, Generation
from app.providers.base import ChatRequest, Chunk
from app.providers.errors import UpstreamError
from tests.factories import AccountFactory

HELLO = [{"role": "user", "content": "Hello world"}]
TTL = 60


def caller_with(credits: str):
    _, issued = AccountFactory.with_key(credits=Decimal(credits))
    return find_caller(issued.value)


def start(caller, model_id: str = "dev-chat-mini", **request: object):
    fields = {"model": model_id, "messages": HELLO, **request}
    return lifecycle.start_generation(
        caller=caller,
        model=current_catalog().resolve(model_id),
        request=ChatRequest(**fields),
        hold_ttl_seconds=TTL,
    )


def money(account_id: int) -> tuple[Decimal, Decimal]:
    db.session.expire_all()
    account = db.session.get(Account, account_id)
    return account.balance, account.reserved


def charges(generation_id: str) -> list[Decimal]:
    return list(
        db.session.scalars(
            select(LedgerEntry.amount).where(LedgerEntry.generation_id == generation_id)
        )
    )


def test_a_generation_holds_its_worst_case_under_its_own_id(app_context):
    caller = caller_with("1")
    generation = lifecycle.start_generation(
        caller=caller,
        model=current_catalog().resolve("dev-chat-mini"),
        request=ChatRequest(model="dev-chat-mini", messages=HELLO, params={"max_tokens": 10}),
        hold_ttl_seconds=TTL,
        generation_id="resp_own-id",
        api=RESPONSES,
    )

    hold = db.session.get(Hold, "resp_own-id")
    assert generation.hold.id == hold.id == generation.id
    # The prompt's byte bound and 10 completion tokens at the model's prices.
    pricing = generation.model.pricing
    worst = (generation.prompt_tokens * pricing.prompt + 10 * pricing.completion) / 1_000_000
    assert hold.amount == generation.hold.amount == worst.quantize(Decimal("1e-10"))
    assert money(caller.account_id) == (Decimal("1"), hold.amount)
    lifecycle.run_generation(generation)
    assert db.session.get(Generation, "resp_own-id").api == RESPONSES


def test_a_whole_answer_is_charged_its_usage_once(app_context):
    caller = caller_with("1")
    generation = start(caller)

    answer = lifecycle.run_generation(generation)

    assert answer.cost == cost_of(answer.completion.usage, generation.model.pricing) > 0
    assert charges(generation.id) == [-answer.cost]
    assert money(caller.account_id) == (Decimal("1") - answer.cost, 0)
    record = db.session.get(Generation, generation.id)
    assert (record.status, record.cost, record.shortfall) == ("completed", answer.cost, 0)
    assert generation.settled


def test_a_stream_yields_its_chunks_then_its_end_after_settling(app_context):
    caller = caller_with("1")
    generation = start(caller, stream=True)

    items = list(lifecycle.stream_generation(generation))

    chunks = [item for item in items if isinstance(item, Chunk)]
    end = items[-1]
    assert chunks and all(chunk.choices for chunk in chunks)
    # What the upstream sent goes out before the settlement: a flush point precedes it.
    assert items[-2] is None
    assert isinstance(end, lifecycle.StreamEnd)
    assert end.cost == cost_of(end.usage, generation.model.pricing)
    assert charges(generation.id) == [-end.cost]
    assert db.session.get(Generation, generation.id).status == "completed"


def test_a_stream_its_caller_leaves_is_charged_what_it_delivered_once(app_context):
    caller = caller_with("1")
    generation = start(caller, "dev-slow", stream=True)
    stream = lifecycle.stream_generation(generation)
    delivered = [next(stream) for _ in range(4)]

    stream.close()

    record = db.session.get(Generation, generation.id)
    texts = [
        choice["delta"].get("content") or ""
        for chunk in delivered
        if isinstance(chunk, Chunk)
        for choice in chunk.choices
    ]
    assert record.status == "cancelled" and record.estimated
    assert record.completion_tokens == sum(1 for text in texts if text)
    assert charges(generation.id) == [-record.cost] and record.cost > 0
    assert money(caller.account_id)[1] == 0


def test_a_failed_whole_answer_is_recorded_at_no_cost(app_context):
    caller = caller_with("1")
    generation = start(caller, "dev-dying")

    with pytest.raises(UpstreamError):
        lifecycle.run_generation(generation)

    record = db.session.get(Generation, generation.id)
    assert (record.status, record.cost) == ("failed", 0)
    assert charges(generation.id) == []
    assert money(caller.account_id) == (Decimal("1"), 0)


def test_progress_is_taken_only_of_what_was_delivered_since(app_context):
    caller = caller_with("1")
    generation = start(caller, "dev-slow", stream=True)
    stream = lifecycle.stream_generation(generation)
    assert lifecycle.progress_of(generation) is None, "nothing streamed yet"
    for _ in range(4):
        next(stream)

    progress = lifecycle.progress_of(generation)

    assert progress["status"] == "interrupted" and progress["estimated"] is True
    assert progress["completion_tokens"] > 0 and progress["model"] == "dev-slow"
    assert lifecycle.progress_of(generation) is None, "nothing delivered since"
    stream.close()
    assert lifecycle.progress_of(generation) is None, "settled"


@pytest.mark.parametrize("ended", [False, True], ids=["mid-generation", "generation-ended"])
def test_an_interrupted_stream_is_settled_at_its_progress_once_its_generation_ended(
    app_context, ended
):
    caller = caller_with("1")
    generation = start(caller, "dev-slow", stream=True)
    stream = lifecycle.stream_generation(generation)
    for _ in range(4):
        next(stream)
    while ended and not generation.meter.ended:
        next(stream)
    progress = lifecycle.progress_of(generation)
    # Its worker dies: the stream never settles itself.
    generation.settled = True

    charged = lifecycle.settle_interrupted(generation.hold, progress)

    record = db.session.get(Generation, generation.id)
    assert record.status == "interrupted" and record.estimated
    limit = generation.request.max_output_tokens or generation.model.max_output_tokens
    assert progress["ended"] is ended and 0 < progress["completion_tokens"] < limit
    # Before its end, what went out since the record is unknown: the request's limit.
    assert record.completion_tokens == (progress["completion_tokens"] if ended else limit)
    assert (
        charged
        == record.cost
        == cost_of(
            lifecycle.Usage(
                prompt_tokens=record.prompt_tokens, completion_tokens=record.completion_tokens
            ),
            generation.model.pricing,
        )
    )
    assert charges(generation.id) == [-charged]
    assert money(caller.account_id) == (Decimal("1") - charged, 0)
