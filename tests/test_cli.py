"""The operator commands, as a deploy script would run them."""

from __future__ import annotations

import uuid
from decimal import Decimal

from app.accounts.organisations import find_person_by_email, owner_membership
from app.auth.keys import parse_key
from app.credits.accounts import find_account


def email() -> str:
    return f"ops-{uuid.uuid4().hex[:10]}@example.com"


def last_line(result) -> str:
    return result.output.strip().splitlines()[-1]


def test_account_credits_and_key_lifecycle(runner):
    address = email()
    created = runner.invoke(args=["accounts", "create", address, "--credits", "5"])
    assert created.exit_code == 0, created.output
    assert "balance=$5" in created.output

    granted = runner.invoke(args=["credits", "grant", address, "2.5", "--idempotency-key", "k1"])
    again = runner.invoke(args=["credits", "grant", address, "2.5", "--idempotency-key", "k1"])
    assert "balance=$7.5" in granted.output
    assert "already granted" in again.output and "balance=$7.5" in again.output

    issued = runner.invoke(args=["keys", "create", address, "--name", "ci"])
    value = last_line(issued)
    assert parse_key(value) == value
    key_id = issued.output.split("created key ")[1].split()[0]

    rotated = runner.invoke(args=["keys", "rotate", key_id])
    assert parse_key(last_line(rotated)) and last_line(rotated) != value

    listed = runner.invoke(args=["keys", "list", address])
    assert f"{key_id}\tci\t" in listed.output and "\tactive\t" in listed.output
    assert value not in listed.output and last_line(rotated) not in listed.output

    assert runner.invoke(args=["keys", "revoke", key_id]).exit_code == 0
    assert "\trevoked\t" in runner.invoke(args=["keys", "list", address]).output
    assert runner.invoke(args=["keys", "delete", key_id]).exit_code == 0
    assert key_id + "\t" not in runner.invoke(args=["keys", "list", address]).output


def test_wrong_input_gets_one_line_and_a_nonzero_exit(runner):
    address = email()
    runner.invoke(args=["accounts", "create", address])
    cases = [
        ["accounts", "create", address],
        ["credits", "grant", "nobody@example.com", "5"],
        ["credits", "grant", address, "-5"],
        ["credits", "grant", address, "lots"],
        ["keys", "create", "nobody@example.com", "--name", "x"],
        ["keys", "revoke", "999999"],
        ["keys", "rotate", "abc"],
        ["keys", "create", address],
        ["accounts", "create"],
    ]
    for args in cases:
        result = runner.invoke(args=args)
        assert result.exit_code == 1, args
        assert result.stdout == "", args
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("Error: "), line


def test_account_created_with_zero_credits_is_an_empty_account(runner):
    address = email()
    created = runner.invoke(args=["accounts", "create", address, "--credits", "0"])
    assert created.exit_code == 0, created.output
    assert "balance=$0" in created.output
    granted = runner.invoke(args=["credits", "grant", address, "0"])
    assert granted.exit_code == 1
    assert "must be a positive amount" in granted.stderr
    negative = runner.invoke(args=["accounts", "create", email(), "--credits", "-1"])
    assert negative.exit_code == 1
    assert "must not be negative" in negative.stderr


def test_idempotency_key_reused_for_another_amount_is_refused(runner):
    address = email()
    runner.invoke(args=["accounts", "create", address])
    runner.invoke(args=["credits", "grant", address, "1", "--idempotency-key", "same"])
    result = runner.invoke(args=["credits", "grant", address, "2", "--idempotency-key", "same"])
    assert result.exit_code == 1
    assert "was used for a grant of" in result.output


def test_catalog_list(runner):
    output = runner.invoke(args=["catalog", "list"]).output
    # Prices, 1-hour cache writes at the 5-minute price, no tool calls or tiers priced.
    assert "dev-chat\t0.50\t1.50\t0.05\t0.25\t0.50\t0.50\t-\t-\t32768\t" in output
    assert "dev-hidden" not in output


def test_catalog_list_shows_tool_call_and_tier_prices(app, runner, monkeypatch):
    from app.catalog.registry import build_catalog

    pricing = {
        "prompt": Decimal(3),
        "completion": Decimal(15),
        "cache_write": Decimal("3.75"),
        "cache_write_1h": Decimal(6),
        "tool_calls": {"web_search": Decimal("0.01"), "code_execution": Decimal("0.03")},
        "tiers": {"priority": Decimal(2)},
    }
    entry = {"id": "claude", "pricing": pricing, "routes": [{"upstream": "builtin"}]}
    monkeypatch.setitem(app.extensions, "catalog", build_catalog({"models": [entry]}))

    output = runner.invoke(args=["catalog", "list"]).output

    assert output.splitlines()[0].startswith(
        "id\tprompt\tcompletion\tcached_read\timage\tcache_write\tcache_write_1h\ttool_calls\ttiers\t"
    )
    assert (
        "claude\t3\t15\t3\t3\t3.75\t6\tcode_execution=0.03,web_search=0.01\tpriority=2\t" in output
    )


def test_demo_setup_prints_its_key_once(runner, app):
    import re

    from app.cli import DEMO_EMAIL
    from app.credits.accounts import find_account
    from tests.dashboard.conftest import new_client, sign_in

    with app.app_context():
        assert find_account(DEMO_EMAIL) is None  # each test database starts empty
    first = runner.invoke(args=["demo", "setup"])
    second = runner.invoke(args=["demo", "setup"])
    assert parse_key(last_line(first))
    assert "$10 of credits" in first.output
    assert parse_key(last_line(second)) is None
    assert "exists" in second.output
    password = re.search(r"as demo@example.com with the password (\S+)", first.output).group(1)
    assert sign_in(new_client(app), DEMO_EMAIL, password).status_code == 302


def test_admin_means_the_operator_flag_and_says_so(app, runner):
    shown = runner.invoke(args=["accounts", "create", "--help"])
    assert "the gateway's operator, not an organisation's admin role" in " ".join(
        shown.output.split()
    )
    address = email()
    assert runner.invoke(args=["accounts", "create", address, "--admin"]).exit_code == 0
    with app.app_context():
        person = find_person_by_email(address)
        assert person.is_admin
        assert owner_membership(find_account(address).id).role == "owner"
