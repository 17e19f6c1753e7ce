"""``flask keys create --models --monthly-limit`` and the limits in ``flask keys list``."""

from __future__ import annotations

import uuid

from app.auth.keys import find_caller, parse_key
from app.auth.models import ApiKey
from app.extensions import db


def funded_address(runner) -> str:
    address = f"ops-{uuid.uuid4().hex[:10]}@example.com"
    assert runner.invoke(args=["accounts", "create", address, "--credits", "5"]).exit_code == 0
    return address


def test_a_key_created_with_models_and_a_limit_lists_them(runner, app):
    address = funded_address(runner)
    issued = runner.invoke(
        args=[
            "keys",
            "create",
            address,
            "--name",
            "ci",
            "--models",
            "dev-chat-mini, dev-slow",
            "--monthly-limit",
            "0.000010",
        ]
    )
    assert issued.exit_code == 0, issued.output
    value = issued.output.strip().splitlines()[-1]
    assert parse_key(value) == value
    with app.app_context():
        caller = find_caller(value)
        budget = db.session.get(ApiKey, caller.key_id).budget
    assert caller.permitted_models == {"dev-chat-mini", "dev-slow"}
    assert str(budget) == "0.00001"
    runner.invoke(args=["keys", "create", address, "--name", "open"])
    listed = runner.invoke(args=["keys", "list", address]).output.splitlines()
    assert listed[0].endswith("\tmodels\tlimit")
    assert listed[1].startswith(issued.output.split("created key ")[1].split()[0] + "\tci\t")
    assert listed[1].endswith("\tdev-chat-mini,dev-slow\t$0.00001 a month")
    assert listed[2].endswith("\tall\tnone")


def test_wrong_limits_get_one_line_and_write_nothing(runner):
    address = funded_address(runner)
    cases = [
        ["--models", "dev-chat,gpt-imaginary"],
        ["--models", ","],
        ["--monthly-limit", "-1"],
        ["--monthly-limit", "0.0000001"],
        ["--monthly-limit", "lots"],
    ]
    for extra in cases:
        result = runner.invoke(args=["keys", "create", address, "--name", "x", *extra])
        assert result.exit_code == 1, extra
        assert result.stdout == "", extra
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("Error: "), line
    assert runner.invoke(args=["keys", "list", address]).output.count("\n") == 1
