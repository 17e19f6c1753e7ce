"""A hold left behind by a worker killed mid-request is released by the service itself."""

from __future__ import annotations

import json
import os
import signal
import time
from decimal import Decimal
from pathlib import Path

from sqlalchemy import select

from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import running_server
from tests.contract.conftest import open_slow_stream


def child_pids(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (gunicorn's workers)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


def holds_of(app, account_id):
    with app.app_context():
        db.session.expire_all()
        account = db.session.get(Account, account_id)
        holds = db.session.scalars(select(Hold).where(Hold.account_id == account_id)).all()
        charges = db.session.scalars(
            select(LedgerEntry).where(
                LedgerEntry.account_id == account_id, LedgerEntry.kind == "charge"
            )
        ).all()
        return account, [hold.status for hold in holds], charges


def test_a_killed_workers_hold_is_ended_by_the_service_and_its_output_billed(
    app, database_url, tmp_path, make_funded_key
):
    """The hold of a stream whose worker died is ended by another's sweeper, after its TTL.

    Output had gone out, and what went out after its last record cannot be known: it is
    charged at the request's limits, within its hold (test_interrupted_streams.py has the
    rule's other cases).
    """
    funded = make_funded_key(Decimal("1"))
    with running_server(database_url, tmp_path, HOLD_TTL_SECONDS="2") as server:
        response = open_slow_stream(server.url, funded.key)
        lines = response.iter_lines()
        assert next(lines).startswith(b"data: ")
        (worker,) = child_pids(server.process.pid)
        os.kill(worker, signal.SIGKILL)
        response.close()

        account, statuses, _ = holds_of(app, funded.account_id)
        assert statuses == ["open"] and account.reserved > 0
        held = account.reserved

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and holds_of(app, funded.account_id)[1] == ["open"]:
            time.sleep(0.25)
    account, statuses, charges = holds_of(app, funded.account_id)
    assert statuses == ["settled"] and account.reserved == 0
    (charge,) = charges
    assert 0 < -charge.amount <= held and account.balance == Decimal("1") + charge.amount


def recorded_progress(app, hold_id: str) -> dict | None:
    with app.app_context():
        progress = db.session.scalar(select(Hold.progress).where(Hold.id == hold_id))
        db.session.commit()
        return progress


def generation_of(app, generation_id: str) -> Generation | None:
    with app.app_context():
        generation = db.session.get(Generation, generation_id)
        if generation is not None:
            db.session.expunge(generation)
        db.session.commit()
        return generation


def wait_for(read, seconds: float):
    """Call ``read`` until it returns something true, for at most ``seconds``; return that."""
    deadline = time.monotonic() + seconds
    while not (value := read()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def test_a_stream_whose_worker_is_killed_is_charged_what_it_delivered(
    app, database_url, tmp_path, make_funded_key
):
    funded = make_funded_key(Decimal("1"))
    with running_server(database_url, tmp_path, HOLD_TTL_SECONDS="4") as server:
        response = open_slow_stream(server.url, funded.key)
        events = (json.loads(line[6:]) for line in response.iter_lines() if line)
        received = [next(events) for _ in range(30)]
        generation_id = received[0]["id"]
        delivered = sum(bool(e["choices"][0]["delta"].get("content")) for e in received)
        # What the worker records, about once a second, has caught up with the caller.
        progress = wait_for(
            lambda: (
                (p := recorded_progress(app, generation_id))
                and p["completion_tokens"] >= delivered
                and p
            ),
            10,
        )
        assert progress, "the stream's progress was never recorded"
        (worker,) = child_pids(server.process.pid)
        os.kill(worker, signal.SIGKILL)
        response.close()

        generation = wait_for(lambda: generation_of(app, generation_id), 20)
    account, statuses, charges = holds_of(app, funded.account_id)
    assert generation is not None, "the killed stream's hold was never settled"
    assert generation.status == "interrupted" and generation.estimated
    assert generation.completion_tokens >= delivered
    assert generation.completion_tokens >= progress["completion_tokens"]
    assert statuses == ["settled"] and account.reserved == 0
    assert [charge.amount for charge in charges] == [-generation.cost] and generation.cost > 0
    assert account.balance == Decimal("1") - generation.cost
