"""Every charge is totalled into its account's, key's, model's and hour's row, exactly."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import func, select

from app.auth.keys import find_caller
from app.catalog.registry import current_catalog
from app.credits import holds, settlement
from app.credits.models import NO_KEY, UsageRollup
from app.extensions import db
from app.generations import lifecycle
from app.generations.models import Generation
from app.providers.base import ChatRequest
from tests.factories import AccountFactory

HELLO = [{"role": "user", "content": "Hello world"}]
SUMS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost", "shortfall")


def rollups_of(account_id: int) -> dict[tuple, tuple]:
    rows = db.session.execute(
        select(UsageRollup).where(UsageRollup.account_id == account_id)
    ).scalars()
    return {
        (row.api_key_id, row.model, row.hour): tuple(getattr(row, name) for name in SUMS)
        for row in rows
    }


def raw_totals(account_id: int) -> dict[tuple, tuple]:
    generations = db.session.scalars(
        select(Generation).where(Generation.account_id == account_id)
    ).all()
    totals: dict[tuple, list] = {}
    for g in generations:
        key = (g.api_key_id or NO_KEY, g.model, settlement.hour_of(g.created_at))
        sums = totals.setdefault(key, [0, 0, 0, 0, Decimal(0), Decimal(0)])
        for index, value in enumerate(
            (1, g.prompt_tokens, g.cached_tokens, g.completion_tokens, g.cost, g.shortfall)
        ):
            sums[index] += value
    return {key: tuple(sums) for key, sums in totals.items()}


def start(caller, model_id: str, **fields):
    return lifecycle.start_generation(
        caller=caller,
        model=current_catalog().resolve(model_id),
        request=ChatRequest(model=model_id, messages=HELLO, **fields),
        hold_ttl_seconds=60,
    )


def test_rollups_equal_the_raw_generations_whatever_ended_them(app_context):
    account, issued = AccountFactory.with_key(credits=Decimal("1"))
    caller = find_caller(issued.value)
    for model_id in ("dev-chat", "dev-chat", "dev-chat-mini"):
        lifecycle.run_generation(start(caller, model_id))
    list(lifecycle.stream_generation(start(caller, "dev-chat", stream=True)))
    hung_up = lifecycle.stream_generation(start(caller, "dev-slow", stream=True))
    [next(hung_up) for _ in range(3)]
    hung_up.close()
    interrupted = start(caller, "dev-slow", stream=True)
    stream = lifecycle.stream_generation(interrupted)
    [next(stream) for _ in range(3)]
    progress = lifecycle.progress_of(interrupted)
    interrupted.settled = True
    lifecycle.settle_interrupted(interrupted.hold, progress)

    rolled = rollups_of(account.id)

    assert rolled == raw_totals(account.id)
    assert sum(sums[0] for sums in rolled.values()) == 6
    assert {model for _, model, _ in rolled} == {"dev-chat", "dev-chat-mini", "dev-slow"}


def test_a_shortfall_and_a_keyless_charge_are_rolled_up_too(app_context):
    account = AccountFactory.create(credits=Decimal("0.001"))
    held = holds.place_hold(account_id=account.id, amount=Decimal("0.0005"), ttl_seconds=60)
    hour = settlement.hour_of(lifecycle.utcnow())

    charged = settlement.settle_hold(
        held,
        cost=Decimal("0.002"),
        generation_id=held.id,
        rollup=settlement.Rollup(model="m", hour=hour, prompt_tokens=10, completion_tokens=5),
    )

    assert charged == Decimal("0.001")
    assert rollups_of(account.id) == {
        (NO_KEY, "m", hour): (1, 10, 0, 5, Decimal("0.001"), Decimal("0.001"))
    }
    again = holds.place_hold(account_id=account.id, amount=Decimal("0"), ttl_seconds=60)
    settlement.settle_hold(
        again,
        cost=Decimal("0"),
        generation_id=again.id,
        rollup=settlement.Rollup(model="m", hour=hour, prompt_tokens=3),
    )
    assert (
        db.session.scalar(
            select(func.sum(UsageRollup.requests)).where(UsageRollup.account_id == account.id)
        )
        == 2
    )
