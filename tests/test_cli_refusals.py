"""Operator input the commands refuse: one line on stderr, a non-zero exit, nothing written."""

from __future__ import annotations

import uuid

import pytest


def email() -> str:
    return f"ops-{uuid.uuid4().hex[:10]}@example.com"


def org_name() -> str:
    return f"Team {uuid.uuid4().hex[:6]}"


def refused(runner, *args: str) -> str:
    """Run a command that must refuse; return its one line on stderr."""
    result = runner.invoke(args=list(args))
    assert result.exit_code == 1, (args, result.output)
    assert result.stdout == "", (args, result.stdout)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: "), line
    return line


def ok(runner, *args: str) -> str:
    result = runner.invoke(args=list(args))
    assert result.exit_code == 0, (args, result.output)
    return result.stdout


@pytest.mark.parametrize(
    "address", ["not-an-email", "two@@example.com", "a b@example.com", "@example.com", "me@", ""]
)
def test_an_account_is_not_created_for_what_is_no_email_address(runner, address):
    line = refused(runner, "accounts", "create", address)
    assert f"{address!r} is not an e-mail address" in line
    refused(runner, "keys", "list", address)  # and nothing was made under that name


def test_an_organisation_owner_or_invitee_must_be_an_email_address(runner):
    name = org_name()
    line = refused(runner, "orgs", "create", name, "--owner", "not-an-email")
    assert "'not-an-email' is not an e-mail address" in line
    refused(runner, "orgs", "members", name)
    ok(runner, "orgs", "create", name, "--owner", email())
    assert "is not an e-mail address" in refused(runner, "orgs", "invite", name, "nobody")


def test_a_second_organisation_of_a_taken_name_is_refused_in_any_letter_case(runner):
    name, owner = org_name(), email()
    created = ok(runner, "orgs", "create", name, "--owner", owner)
    org_id = created.split()[2]
    for taken in (name, name.upper(), f"  {name.lower()} "):
        line = refused(runner, "orgs", "create", taken, "--owner", email())
        assert f"an organisation named {name!r} exists already (id {org_id})" in line
    assert owner in ok(runner, "orgs", "members", name)  # the name still finds the one
    assert "must not be blank" in refused(runner, "orgs", "create", "  ", "--owner", email())


def test_a_key_of_another_organisation_is_named_as_such(runner):
    ours, theirs = org_name(), org_name()
    ok(runner, "orgs", "create", ours, "--owner", email())
    theirs_id = ok(runner, "orgs", "create", theirs, "--owner", email()).split()[2]
    issued = ok(runner, "keys", "create", "--org", theirs, "--name", "x")
    key_id = issued.split("created key ")[1].split()[0]

    line = refused(runner, "orgs", "budget", ours, "--key", key_id, "--usd", "5")
    assert f"API key {key_id} belongs to another organisation (id {theirs_id})" in line
    assert "no API key with id 999999" in refused(
        runner, "orgs", "budget", ours, "--key", "999999", "--usd", "5"
    )


def test_an_organisation_is_not_named_with_an_e_mail_address(runner):
    """An address names its holder's own organisation: taken first, sign-up would make a twin."""
    holder = email()
    line = refused(runner, "orgs", "create", holder, "--owner", email())
    assert "must not be an e-mail address" in line
    refused(runner, "orgs", "members", holder)  # nothing was made under that name
