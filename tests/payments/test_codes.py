"""Redemption codes: made by the operator's CLI, redeemed once over HTTP, until they expire."""

from __future__ import annotations

import json
import re
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal

import requests
from sqlalchemy import select, update

from app.database import utcnow
from app.extensions import db
from app.payments.models import RedemptionCode
from tests.dashboard.conftest import PASSWORD, make_holder
from tests.payments.conftest import books


def run(runner, *args: str) -> str:
    result = runner.invoke(args=list(args))
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def signed_in_session(url: str, email: str) -> requests.Session:
    """A browser-like session signed in to the gateway at ``url``."""
    session = requests.Session()
    session.headers["X-Forwarded-For"] = f"10.9.{uuid.uuid4().int % 250}.1"
    token = _token(session.get(f"{url}/signin", timeout=10).text)
    signed = session.post(
        f"{url}/signin",
        data={"csrf_token": token, "email": email, "password": PASSWORD},
        allow_redirects=False,
        timeout=10,
    )
    assert signed.status_code == 302
    return session


def _token(html: str) -> str:
    return re.search(r'name="csrf_token"[^>]*value="([^"]+)"', html).group(1)


def test_codes_print_one_a_line_and_are_kept_as_digests(app, runner):
    codes = run(runner, "codes", "create", "--usd", "2.5", "--count", "3", "--expires", "7")
    lines = codes.splitlines()
    assert len(lines) == 3 and len(set(lines)) == 3
    assert all(re.fullmatch(r"gc_[0-9a-f]{10}_[A-Za-z0-9_-]{32}", line) for line in lines)
    with app.app_context():
        stored = db.session.scalars(
            select(RedemptionCode).where(RedemptionCode.id.in_([c.split("_")[1] for c in lines]))
        ).all()
        assert len(stored) == 3
        for code in stored:
            assert code.amount == Decimal("2.5") and len(code.digest) == 64
            assert (code.expires_at - code.created_at) == timedelta(days=7)
            assert all(code.digest not in line and line not in code.digest for line in lines)
    for bad in (["--usd", "0"], ["--usd", "1", "--count", "0"], ["--usd", "1", "--expires", "0"]):
        refused = runner.invoke(args=["codes", "create", *bad])
        assert refused.exit_code != 0 and len(refused.output.strip().splitlines()) == 1


def test_of_concurrent_redemptions_of_one_code_one_wins(app, runner, payments_server):
    (code,) = run(runner, "codes", "create", "--usd", "4").split()
    holders = [make_holder(app, Decimal(0)) for _ in range(4)]
    sessions = [signed_in_session(payments_server.url, email) for _, email in holders]
    tokens = [_token(s.get(f"{payments_server.url}/balance", timeout=10).text) for s in sessions]

    def redeem(index: int) -> int:
        return (
            sessions[index]
            .post(
                f"{payments_server.url}/balance/redeem",
                data={"csrf_token": tokens[index], "code": code},
                allow_redirects=False,
                timeout=30,
            )
            .status_code
        )

    with ThreadPoolExecutor(max_workers=4) as pool:
        statuses = sorted(pool.map(redeem, range(4)))
    assert statuses == [303, 400, 400, 400]
    balances = [books(app, account_id)[0] for account_id, _ in holders]
    assert sorted(balances) == [0, 0, 0, Decimal(4)]


def test_an_expired_code_is_refused(app, runner, payments_server):
    (code,) = run(runner, "codes", "create", "--usd", "4", "--expires", "1").split()
    with app.app_context():
        db.session.execute(
            update(RedemptionCode)
            .where(RedemptionCode.id == code.split("_")[1])
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
        db.session.commit()
    account_id, email = make_holder(app, Decimal(0))
    session = signed_in_session(payments_server.url, email)
    token = _token(session.get(f"{payments_server.url}/balance", timeout=10).text)
    refused = session.post(
        f"{payments_server.url}/balance/redeem",
        data={"csrf_token": token, "code": code},
        timeout=10,
    )
    assert refused.status_code == 400 and "expired" in refused.text
    assert books(app, account_id)[0] == 0


def test_payments_list_shows_payments_refunds_and_codes(app, runner, payments_server):
    (code,) = run(runner, "codes", "create", "--usd", "3").split()
    account_id, email = make_holder(app, Decimal(0))
    session = signed_in_session(payments_server.url, email)
    token = _token(session.get(f"{payments_server.url}/balance", timeout=10).text)
    session.post(
        f"{payments_server.url}/balance/redeem",
        data={"csrf_token": token, "code": code},
        timeout=10,
    )
    with app.app_context():
        from app.credits.models import Account

        name = db.session.get(Account, account_id).name
    header, line = run(runner, "payments", "list", str(account_id)).splitlines()
    assert header.split("\t") == [
        "time", "organisation", "kind", "reference", "amount_usd", "fee_usd", "status", "receipt",
    ]  # fmt: skip
    cells = line.split("\t")
    assert cells[1:8] == [name, "code", "gc_" + code.split("_")[1], "3", "0", "redeemed", "-"]
    (row,) = json.loads(run(runner, "payments", "list", str(account_id), "--json"))
    assert row["kind"] == "code" and row["amount_usd"] == "3" and row["receipt"] == ""
    other, _ = make_holder(app, Decimal(0))
    assert run(runner, "payments", "list", str(other)).strip() == "no payments"
    missing = runner.invoke(args=["payments", "list", "no such organisation"])
    assert missing.exit_code == 1
