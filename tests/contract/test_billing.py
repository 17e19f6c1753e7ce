"""Money as the caller sees it: every cost received is exactly what left the balance."""

from __future__ import annotations

import json
from decimal import Decimal

import requests
from sqlalchemy import func, select

from app.credits.models import Account, LedgerEntry
from app.extensions import db
from app.generations.models import Generation


def post_completion(live_server, key, body):
    response = requests.post(
        f"{live_server.url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json=body,
        stream=body.get("stream", False),
        timeout=30,
    )
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        return json.loads(response.content, parse_float=Decimal)["usage"]["cost"]["total_cost"]
    usage_events = [
        json.loads(line[len(b"data: ") :], parse_float=Decimal)
        for line in response.iter_lines()
        if line.startswith(b"data: {")
    ]
    return usage_events[-1]["usage"]["cost"]["total_cost"]


def account_state(app, account_id):
    with app.app_context():
        account = db.session.get(Account, account_id)
        ledger_sum = db.session.scalar(
            select(func.coalesce(func.sum(LedgerEntry.amount), 0)).where(
                LedgerEntry.account_id == account_id
            )
        )
        generations = db.session.scalar(
            select(func.count()).select_from(Generation).where(Generation.account_id == account_id)
        )
        return account.balance, account.reserved, ledger_sum, generations


def test_balance_falls_by_exactly_the_costs_received(app, live_server, make_funded_key):
    start = Decimal("2")
    funded = make_funded_key(start)
    bodies = [
        {
            "model": "dev-chat",
            "messages": [{"role": "user", "content": f"question {i}"}],
            "reasoning_effort": "high",
        }
        for i in range(6)
    ] + [
        {
            "model": "dev-chat-mini",
            "messages": [{"role": "user", "content": f"stream {i}"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 2,
        }
        for i in range(6)
    ]
    costs = [post_completion(live_server, funded.key, body) for body in bodies]
    assert all(cost > 0 for cost in costs)
    balance, reserved, ledger_sum, generations = account_state(app, funded.account_id)
    assert balance == start - sum(costs)
    assert ledger_sum == balance
    assert reserved == 0
    assert generations == len(bodies)
