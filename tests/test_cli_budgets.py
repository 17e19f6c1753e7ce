"""``flask orgs budget`` and ``flask keys create --limit --per``: budgets of members and keys."""

from __future__ import annotations

import uuid
from decimal import Decimal

from sqlalchemy import select

from app.accounts.models import Membership
from app.auth.models import ApiKey
from app.extensions import db


def organisation_with_key(runner) -> tuple[str, int]:
    address = f"org-{uuid.uuid4().hex[:10]}@example.com"
    assert runner.invoke(args=["accounts", "create", address, "--credits", "5"]).exit_code == 0
    created = runner.invoke(args=["keys", "create", address, "--name", "ci"])
    assert created.exit_code == 0, created.output
    return address, int(created.output.split("created key ")[1].split()[0])


def budget_of(app, model, row_id: int) -> tuple:
    with app.app_context():
        row = db.session.get(model, row_id)
        return row.budget, row.budget_window


def test_a_members_budget_is_set_and_cleared(runner, app):
    address, key_id = organisation_with_key(runner)
    args = ["orgs", "budget", address, address]
    done = runner.invoke(args=[*args, "--usd", "50", "--per", "week"])
    assert done.exit_code == 0, done.output
    assert done.output.strip() == f"member {address} of {address}: $50 a week"
    with app.app_context():
        member_id = db.session.scalar(select(ApiKey.member_id).where(ApiKey.id == key_id))
    assert budget_of(app, Membership, member_id) == (Decimal("50"), "week")
    listed = runner.invoke(args=["orgs", "members", address]).output.splitlines()
    assert listed[1].split("\t")[2:] == [address, listed[1].split("\t")[3], "$50", "week", "$0"]
    cleared = runner.invoke(args=[*args, "--usd", "none"])
    assert cleared.exit_code == 0 and cleared.output.strip().endswith(": no budget")
    assert budget_of(app, Membership, member_id) == (None, "month")


def test_a_keys_budget_is_set_in_a_five_hour_window(runner, app):
    address, key_id = organisation_with_key(runner)
    args = ["orgs", "budget", address, "--key", str(key_id), "--usd", "2.5"]
    done = runner.invoke(args=[*args, "--per", "5h"])
    assert done.exit_code == 0, done.output
    assert budget_of(app, ApiKey, key_id) == (Decimal("2.5"), "5h")
    listed = runner.invoke(args=["keys", "list", address]).output.splitlines()
    assert listed[1].endswith("\tall\t$2.5 a 5h")


def test_bad_budgets_are_refused_in_one_line(runner, app):
    address, key_id = organisation_with_key(runner)
    other, _ = organisation_with_key(runner)
    key = ["--key", str(key_id)]
    cases = [
        ([other, *key, "--usd", "1"], f"API key {key_id} belongs to another organisation"),
        (
            [address, "nobody@example.com", "--usd", "1"],
            "nobody@example.com is no member of this organisation",
        ),
        (["no-such-org", *key, "--usd", "1"], "no organisation with id or name 'no-such-org'"),
        ([address, *key, "--usd", "-1"], "must not be negative"),
        ([address, *key, "--usd", "1", "--per", "year"], "'year' is not one of"),
        ([address, *key], "Missing option '--usd'"),
        ([address, "--usd", "1"], "name either a member's EMAIL or --key"),
    ]
    for extra, said in cases:
        refused = runner.invoke(args=["orgs", "budget", *extra])
        assert refused.exit_code != 0 and said in refused.output, (extra, refused.output)
    assert budget_of(app, ApiKey, key_id) == (None, "month")


def test_a_key_is_created_with_a_budget_in_a_window(runner, app):
    address, _ = organisation_with_key(runner)
    args = ["keys", "create", address, "--name", "daily", "--limit", "0.75", "--per", "day"]
    created = runner.invoke(args=args)
    assert created.exit_code == 0, created.output
    key_id = int(created.output.split("created key ")[1].split()[0])
    assert budget_of(app, ApiKey, key_id) == (Decimal("0.75"), "day")
    refused = runner.invoke(args=[*args[:4], "refused", "--limit", "-2"])
    assert refused.exit_code != 0 and "must not be negative" in refused.output
    listed = runner.invoke(args=["keys", "list", address]).output
    assert "\trefused\t" not in listed and "$0.75 a day" in listed
