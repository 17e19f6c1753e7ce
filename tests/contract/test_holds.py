"""A hold left behind by a worker killed mid-request is released by the service itself."""

from __future__ import annotations

import os
import signal
import time
from decimal import Decimal
from pathlib import Path

from sqlalchemy import select

from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
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


def test_a_killed_workers_hold_expires_and_is_released(
    app, database_url, tmp_path, make_funded_key
):
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

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and holds_of(app, funded.account_id)[1] != ["expired"]:
            time.sleep(0.25)
    account, statuses, charges = holds_of(app, funded.account_id)
    assert statuses == ["expired"]
    assert account.reserved == 0 and account.balance == Decimal("1") and charges == []
