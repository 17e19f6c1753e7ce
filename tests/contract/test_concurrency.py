"""Hundreds of racing requests through gunicorn's gevent workers never overdraw an account."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import requests
from sqlalchemy import select

from app.credits.models import Account, Hold, LedgerEntry
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import running_server

REQUESTS = 300
THREADS = 48
# Enough for a few dozen answers of dev-chat-mini, far fewer than are sent.
BALANCE = Decimal("0.0006")


def ask(url: str, key: str, index: int) -> tuple[int | str, str | None, Decimal | None]:
    """Send one request; return its status, generation id and the cost the caller saw."""
    body = {
        "model": "dev-chat-mini",
        "messages": [{"role": "user", "content": f"race number {index}"}],
        "max_tokens": 40,
    }
    if index % 2:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    response = requests.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=body,
        timeout=60,
    )
    if response.status_code != 200:
        return response.status_code, None, None
    if not body.get("stream"):
        answer = json.loads(response.content, parse_float=Decimal)
        return 200, answer["id"], answer["usage"]["cost"]["total_cost"]
    events = [e[6:] for e in response.text.split("\n\n") if e.startswith("data: {")]
    last = json.loads(events[-1], parse_float=Decimal)
    if "error" in last:  # the stream started, then failed: its status was already 200
        return f"stream error {last['error']['code']}", None, None
    return 200, last["id"], last["usage"]["cost"]["total_cost"]


def assert_the_race_left_exact_books(app, runner, funded, results, *, sent: int) -> None:
    """Check the books after ``sent`` racing requests of ``funded``'s key.

    No overdraft, no hold left open, one charge per answer, each the cost its caller
    was told, and an audit that agrees.
    """
    statuses = {status for status, _, _ in results}
    assert statuses <= {200, 402}, statuses
    answered = {gid: cost for status, gid, cost in results if status == 200}
    assert 10 < len(answered) < sent, "the balance must run out during the race"

    with app.app_context():
        account = db.session.get(Account, funded.account_id)
        charges = dict(
            db.session.execute(
                select(LedgerEntry.generation_id, LedgerEntry.amount).where(
                    LedgerEntry.account_id == funded.account_id, LedgerEntry.kind == "charge"
                )
            ).all()
        )
        generations = db.session.scalars(
            select(Generation.id).where(Generation.account_id == funded.account_id)
        ).all()
        open_holds = db.session.scalars(
            select(Hold.id).where(Hold.account_id == funded.account_id, Hold.status == "open")
        ).all()

    assert account.balance >= 0 and account.reserved == 0 and open_holds == []
    assert BALANCE - account.balance == sum(answered.values())
    assert set(generations) == set(answered) == set(charges)
    assert all(charges[gid] == -cost for gid, cost in answered.items())
    audit = runner.invoke(args=["ledger", "audit", "--account", str(funded.account_id)])
    assert audit.exit_code == 0, audit.output
    verified = runner.invoke(args=["ledger", "verify", "--account", str(funded.account_id)])
    assert verified.exit_code == 0, verified.output


def test_racing_requests_never_overdraw_and_are_charged_once(
    app, runner, database_url, tmp_path, make_funded_key
):
    funded = make_funded_key(BALANCE)
    with running_server(database_url, tmp_path, WEB_CONCURRENCY="2") as server:
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(lambda i: ask(server.url, funded.key, i), range(REQUESTS)))

    assert_the_race_left_exact_books(app, runner, funded, results, sent=REQUESTS)


SETTLEMENTS = 200


def test_concurrent_settlements_on_one_account_keep_its_chain_linear(
    app, runner, database_url, tmp_path, make_funded_key
):
    """Every one of 200 racing requests is charged, each entry chained after the one before."""
    funded = make_funded_key(Decimal("10"))
    with running_server(database_url, tmp_path, WEB_CONCURRENCY="2") as server:
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(lambda i: ask(server.url, funded.key, i), range(SETTLEMENTS)))
    assert {status for status, _, _ in results} == {200}

    with app.app_context():
        entries = db.session.execute(
            select(LedgerEntry.kind, LedgerEntry.previous_hash, LedgerEntry.entry_hash)
            .where(LedgerEntry.account_id == funded.account_id)
            .order_by(LedgerEntry.id)
        ).all()
        head = db.session.get(Account, funded.account_id).ledger_head
    assert [kind for kind, _, _ in entries].count("charge") == SETTLEMENTS
    # One line: each entry, in the order of the ids, follows the one before it.
    digests = [digest for _, _, digest in entries]
    assert [previous for _, previous, _ in entries][1:] == digests[:-1]
    assert head == digests[-1] and len(set(digests)) == len(digests)
    verified = runner.invoke(args=["ledger", "verify", "--account", str(funded.account_id)])
    assert verified.exit_code == 0, verified.output
    assert "0 broken" in verified.output
