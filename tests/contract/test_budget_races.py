"""200 racing requests over 20 members of one organisation, with member budgets and key limits.

No member, key or organisation passes its limit; every 402 names the limit that stopped
it; the audit is clean afterwards.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import requests
from sqlalchemy import select

from app.accounts.budgets import set_key_budget, set_member_budget
from app.accounts.keys import create_key
from app.accounts.models import MEMBER, Membership, Person
from app.auth.models import ApiKey
from app.credits.models import Account, Hold
from app.extensions import db
from tests.conftest import running_server
from tests.factories import AccountFactory

MEMBERS = 20
KEYS_PER_MEMBER = 2
REQUESTS = 200
THREADS = 32
# One request of the race holds about $0.0000255 (40 completion tokens of dev-chat-mini
# and its short prompt) and is charged about $0.00001: a budget admits one at a time,
# and three or so in all.
MEMBER_BUDGET = Decimal("0.00003")
KEY_LIMIT = Decimal("0.00003")
# Members 0-6 have a budget, members 7-13 keys with a limit, members 14-19 neither.
BUDGETED, KEY_LIMITED = range(0, 7), range(7, 14)
# More than the members with limits spend (about $0.0002), less than that and the 60
# requests of the members without limits (about $0.0006): the balance runs out too,
# after the limits did.
BALANCE = Decimal("0.0005")


def ask(url: str, key: str, index: int) -> tuple[int, str]:
    """Send one request; return its status and, for a 402, its error message."""
    response = requests.post(
        f"{url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={
            "model": "dev-chat-mini",
            "messages": [{"role": "user", "content": f"race number {index}"}],
            "max_tokens": 40,
        },
        timeout=60,
    )
    if response.status_code == 402:
        return 402, json.loads(response.content)["error"]["message"]
    return response.status_code, ""


def organisation(app) -> tuple[int, list[list[tuple[int, str]]]]:
    """Make the organisation, its members, their budgets and keys; return its id and keys."""
    with app.app_context():
        account = AccountFactory.create(credits=BALANCE)
        keys = []
        for number in range(MEMBERS):
            person = Person(email=f"racer{number}-{account.id}@example.com")
            db.session.add(person)
            db.session.flush()
            member = Membership(account_id=account.id, person_id=person.id, role=MEMBER)
            db.session.add(member)
            db.session.commit()
            if number in BUDGETED:
                set_member_budget(member.id, amount=MEMBER_BUDGET, window="day")
            issued = [
                create_key(account_id=account.id, name=f"m{number}k{k}", member_id=member.id)
                for k in range(KEYS_PER_MEMBER)
            ]
            if number in KEY_LIMITED:
                for key in issued:
                    set_key_budget(key.id, amount=KEY_LIMIT, window="week")
            keys.append([(key.id, key.value) for key in issued])
        return account.id, keys


def limit_named(message: str) -> str:
    """Which limit a 402's message names."""
    if "API key's weekly limit" in message:
        return "key"
    if "member's daily budget" in message:
        return "member"
    assert "available balance" in message, message
    return "balance"


def test_racing_members_never_pass_any_limit(app, runner, database_url, tmp_path):
    account_id, keys = organisation(app)
    # The budgeted members' and the key-limited members' requests come first, so that
    # their limits run out before the organisation's balance does.
    order = [n for n in range(REQUESTS) if n % MEMBERS < 14] + [
        n for n in range(REQUESTS) if n % MEMBERS >= 14
    ]

    def race(number: int) -> tuple[int, int, str]:
        member = number % MEMBERS
        _, value = keys[member][(number // MEMBERS) % KEYS_PER_MEMBER]
        status, message = ask(server.url, value, number)
        return member, status, message

    with running_server(database_url, tmp_path, WEB_CONCURRENCY="2") as server:
        with ThreadPoolExecutor(THREADS) as pool:
            results = list(pool.map(race, order))

    assert {status for _, status, _ in results} == {200, 402}
    named = {(member, limit_named(message)) for member, status, message in results if status == 402}
    kinds = {kind for _, kind in named}
    assert kinds == {"key", "member", "balance"}
    for member, kind in named:
        if kind == "member":
            assert member in BUDGETED
        if kind == "key":
            assert member in KEY_LIMITED
    with app.app_context():
        db.session.expire_all()
        balance, reserved = db.session.execute(
            select(Account.balance, Account.reserved).where(Account.id == account_id)
        ).one()
        assert balance >= 0 and reserved == 0
        for key in db.session.scalars(select(ApiKey).where(ApiKey.account_id == account_id)):
            assert key.window_reserved == 0
            assert key.budget is None or key.window_spent <= key.budget
        members = db.session.scalars(
            select(Membership).where(Membership.account_id == account_id)
        ).all()
        for member in members:
            assert member.window_reserved == 0
            assert member.budget is None or member.window_spent <= member.budget
        assert sum(m.window_spent for m in members) == BALANCE - balance
        assert not db.session.scalars(
            select(Hold.id).where(Hold.account_id == account_id, Hold.status == "open")
        ).all()
    audit = runner.invoke(args=["ledger", "audit", "--account", str(account_id)])
    assert audit.exit_code == 0, audit.output
