"""Listings: a header row, a line saying so when empty, and --json for scripts."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal

from app.alerts.delivery import deliver_alerts


def email() -> str:
    return f"ops-{uuid.uuid4().hex[:10]}@example.com"


def run(runner, *args: str) -> str:
    result = runner.invoke(args=list(args))
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


def new_org(runner, *extra: str) -> tuple[str, str]:
    name, owner = f"Team {uuid.uuid4().hex[:6]}", email()
    run(runner, "orgs", "create", name, "--owner", owner, *extra)
    return name, owner


def test_members_are_listed_under_a_header_and_as_json(runner):
    name, owner = new_org(runner)
    header, row = run(runner, "orgs", "members", name).splitlines()
    assert header.split("\t") == ["id", "role", "email", "since", "budget", "window", "spent"]
    assert row.split("\t")[1:3] == ["owner", owner]
    (member,) = json.loads(run(runner, "orgs", "members", name, "--json"))
    assert member["role"] == "owner" and member["email"] == owner
    assert member["budget"] is None and member["window"] == "month"
    assert Decimal(member["spent"]) == 0


def test_alert_listings_say_when_they_are_empty(runner):
    name, _ = new_org(runner)
    assert run(runner, "alerts", "email", "list", name) == f"{name} has no e-mail recipients\n"
    assert run(runner, "alerts", "webhook", "list", name) == f"{name} has no webhooks\n"
    assert run(runner, "alerts", "log", name) == f"{name} has no alert deliveries\n"
    for listing in (["email", "list"], ["webhook", "list"], ["log"]):
        assert json.loads(run(runner, "alerts", *listing, name, "--json")) == []


def test_alert_endpoints_and_deliveries_are_listed_under_a_header_and_as_json(app, runner):
    name, _ = new_org(runner, "--credits", "10")
    run(runner, "alerts", "email", "add", name, "billing@example.com")
    header, row = run(runner, "alerts", "email", "list", name).splitlines()
    assert header == "id\taddress\tsince" and "\tbilling@example.com\t" in row
    (recipient,) = json.loads(run(runner, "alerts", "email", "list", name, "--json"))
    assert recipient["address"] == "billing@example.com"

    run(runner, "alerts", "balance", name, "--below", "12")  # under it already: one event
    with app.app_context():
        deliver_alerts()  # no SMTP_URL here: the delivery fails and says why
    header, row = run(runner, "alerts", "log", name).splitlines()
    assert header.split("\t") == [
        "id", "event", "type", "endpoint", "status", "tries", "last_answer", "next_try",
    ]  # fmt: skip
    assert "\tbalance.below_threshold\tbilling@example.com\t" in row
    (delivery,) = json.loads(run(runner, "alerts", "log", name, "--json"))
    assert delivery["type"] == "balance.below_threshold"
    assert delivery["endpoint"] == "billing@example.com" and delivery["tries"] >= 1
    assert "SMTP_URL" in delivery["last_answer"]


def test_an_organisations_keys_are_listed_with_their_limit_window(runner):
    name, owner = new_org(runner)
    member = email()
    run(runner, "keys", "create", "--org", name, "--name", "ci", "--limit", "2", "--per", "week")
    run(runner, "keys", "create", "--org", name, "--name", "open")
    header, limited, unlimited = run(runner, "keys", "list", "--org", name).splitlines()
    assert header.split("\t")[-2:] == ["models", "limit"]
    assert limited.endswith("\tall\t$2 a week") and unlimited.endswith("\tall\tnone")
    keys = json.loads(run(runner, "keys", "list", "--org", name, "--json"))
    assert [(k["name"], k["limit"], k["window"]) for k in keys] == [
        ("ci", "2", "week"),
        ("open", None, None),
    ]
    assert keys[0]["models"] is None and keys[0]["last_used"] is None

    assert len(run(runner, "keys", "list", "--org", name, owner.upper()).splitlines()) == 3
    assert runner.invoke(args=["keys", "list"]).exit_code == 1
    assert runner.invoke(args=["keys", "list", "--org", name, member]).exit_code == 1


def test_a_monthly_limit_says_its_month(runner):
    address = email()
    run(runner, "accounts", "create", address)
    run(runner, "keys", "create", address, "--name", "m", "--monthly-limit", "3")
    assert run(runner, "keys", "list", address).splitlines()[1].endswith("\t$3 a month")


def test_the_catalog_is_listed_as_json(runner):
    models = json.loads(run(runner, "catalog", "list", "--json"))
    chat = next(m for m in models if m["id"] == "dev-chat")
    assert set(chat["pricing"]) >= {"prompt", "completion"} and chat["routes"]
    assert isinstance(chat["context"], int)
