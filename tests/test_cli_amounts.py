"""USD amounts on the command line: what the ledger cannot hold is refused in one line.

Every command that takes an amount parses it the same way: past what a Money column
holds (922337203.6854775807 USD) or finer than its 1e-10 USD, the operator gets one
line on stderr and exit status 1, and nothing is written.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from app.accounts.models import Membership
from app.auth.models import ApiKey
from app.credits.accounts import find_account
from app.credits.models import Account, LedgerEntry
from app.extensions import db

TOO_LARGE = ["1000000000", "1e12", "922337203.6854775808", "1e999999999"]
TOO_FINE = ["0.00000000001", "0.00000000005", "1e-11", "1.00000000001"]
# What a Money column holds: a signed 64-bit count of 1e-10 USD.
MAX_MONEY = Decimal("922337203.6854775807")
NOT_AMOUNTS = ["nan", "inf", "-inf", "lots", "0x10"]


def email() -> str:
    return f"ops-{uuid.uuid4().hex[:10]}@example.com"


def refused_in_one_line(runner, args: list[str]) -> str:
    result = runner.invoke(args=args)
    assert result.exit_code == 1, (args, result.output)
    assert result.stdout == "", args
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: "), line
    return line


def ledger_of(app, address: str) -> tuple[Decimal, int]:
    with app.app_context():
        account = find_account(address)
        entries = db.session.scalar(
            select(func.count()).where(LedgerEntry.account_id == account.id)
        )
        return account.balance, entries


@pytest.fixture
def address(runner) -> str:
    created = email()
    assert runner.invoke(args=["accounts", "create", created, "--credits", "1"]).exit_code == 0
    return created


@pytest.mark.parametrize("amount", TOO_LARGE + TOO_FINE + NOT_AMOUNTS)
def test_a_grant_the_ledger_cannot_hold_is_refused_and_writes_nothing(app, runner, address, amount):
    line = refused_in_one_line(runner, ["credits", "grant", address, amount])

    if amount in TOO_LARGE:
        assert f"at most {MAX_MONEY} USD" in line
    if amount in TOO_FINE:
        assert "finer than the ledger keeps: 1E-10 USD" in line
    assert ledger_of(app, address) == (Decimal(1), 1)


def test_the_least_and_the_most_the_ledger_holds_are_granted_exactly(app, runner, address):
    least = runner.invoke(args=["credits", "grant", address, "0.0000000001"])
    assert least.exit_code == 0, least.output
    assert "granted $0.0000000001 " in least.output
    assert ledger_of(app, address) == (Decimal("1.0000000001"), 2)

    empty = email()
    assert runner.invoke(args=["accounts", "create", empty]).exit_code == 0
    most = runner.invoke(args=["credits", "grant", empty, f"{MAX_MONEY}"])
    assert most.exit_code == 0, most.output
    assert ledger_of(app, empty) == (MAX_MONEY, 1)


def test_a_grant_that_would_take_the_balance_past_what_the_ledger_holds_is_refused(
    app, runner, address
):
    line = refused_in_one_line(runner, ["credits", "grant", address, "922337203"])

    assert f"the balance would pass the most the ledger holds: {MAX_MONEY} USD" in line
    assert ledger_of(app, address) == (Decimal(1), 1)


@pytest.mark.parametrize("amount", ["1e12", "0.00000000005", "nan"])
def test_every_command_taking_usd_refuses_what_the_ledger_cannot_hold(app, runner, amount):
    owner, name = email(), f"Team {uuid.uuid4().hex[:6]}"
    refused_in_one_line(runner, ["accounts", "create", owner, "--credits", amount])
    refused_in_one_line(runner, ["orgs", "create", name, "--owner", owner, "--credits", amount])
    with app.app_context():
        assert find_account(owner) is None
        assert db.session.scalar(select(Account).where(Account.name == name)) is None

    assert runner.invoke(args=["orgs", "create", name, "--owner", owner]).exit_code == 0
    created = runner.invoke(args=["keys", "create", "--org", name, "--name", "ci"])
    key_id = created.output.split("created key ")[1].split()[0]
    for args in (
        ["orgs", "budget", name, "--key", key_id, "--usd", amount],
        ["orgs", "budget", name, owner, "--usd", amount],
        ["keys", "create", "--org", name, "--name", "x", "--limit", amount],
        ["keys", "create", "--org", name, "--name", "x", "--monthly-limit", amount],
        ["alerts", "balance", name, "--below", amount],
    ):
        refused_in_one_line(runner, args)
    with app.app_context():
        org = db.session.scalar(select(Account).where(Account.name == name))
        keys = db.session.scalars(select(ApiKey).where(ApiKey.account_id == org.id)).all()
        member = db.session.scalar(select(Membership).where(Membership.account_id == org.id))
        assert [key.budget for key in keys] == [None]
        assert member.budget is None and org.alert_below is None
