"""The operator's organisation commands, as a deploy script would run them."""

from __future__ import annotations

import uuid

from sqlalchemy import select

from app.accounts.models import Change
from app.extensions import db
from tests.dashboard.conftest import PASSWORD, new_client, post_form


def email() -> str:
    return f"ops-{uuid.uuid4().hex[:10]}@example.com"


def run(runner, *args: str) -> str:
    result = runner.invoke(args=list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_an_organisation_is_created_granted_invited_listed_and_trimmed(app, runner):
    name, owner, member = f"Team {uuid.uuid4().hex[:6]}", email(), email()
    created = run(runner, "orgs", "create", name, "--owner", owner, "--credits", "3")
    org_id = created.split()[2]
    assert f"'{name}' owned by {owner}" in created

    assert "balance=$5" in run(runner, "credits", "grant", "--org", name, "2")
    assert "balance=$6" in run(runner, "credits", "grant", "--org", org_id, "1")

    link = run(runner, "orgs", "invite", name, member, "--role", "member").splitlines()[-1]
    path = link.removeprefix("http://localhost:8000")
    joined = post_form(new_client(app), path, path, {"password": PASSWORD})
    assert joined.status_code == 302

    listed = run(runner, "orgs", "members", org_id).splitlines()
    assert [line.split("\t")[1:3] for line in listed[1:]] == [["owner", owner], ["member", member]]

    key = run(runner, "keys", "create", member, "--org", name, "--name", "ci").splitlines()[-1]
    headers = {"Authorization": f"Bearer {key}"}
    chat = {"model": "dev-chat", "messages": [{"role": "user", "content": "Hi"}]}
    assert (
        app.test_client().post("/v1/chat/completions", json=chat, headers=headers).status_code
        == 200
    )
    assert "revoked 1 keys" in run(runner, "orgs", "remove", name, member)
    assert (
        app.test_client().post("/v1/chat/completions", json=chat, headers=headers).status_code
        == 403
    )
    assert member not in run(runner, "orgs", "members", name)

    with app.app_context():
        actions = db.session.scalars(
            select(Change.action).where(Change.account_id == int(org_id)).order_by(Change.id)
        ).all()
    assert actions == [
        "organisation.create", "credits.grant", "credits.grant", "member.invite",
        "key.create", "member.remove",
    ]  # fmt: skip


def test_wrong_organisation_input_gets_one_line_and_a_nonzero_exit(runner):
    name, owner = f"Team {uuid.uuid4().hex[:6]}", email()
    run(runner, "orgs", "create", name, "--owner", owner)
    for args in (
        ["orgs", "members", "no such organisation"],
        ["orgs", "invite", name, email(), "--role", "emperor"],
        ["orgs", "invite", name, owner],
        ["orgs", "remove", name, email()],
        ["orgs", "remove", name, owner],
        ["credits", "grant", "--org", name],
        ["credits", "grant", "--org", name, owner, "1"],
        ["keys", "create", email(), "--org", name, "--name", "x"],
    ):
        result = runner.invoke(args=args)
        assert result.exit_code != 0, args
        assert len(result.output.strip().splitlines()) == 1, (args, result.output)


def test_an_invite_to_a_personal_organisation_names_it_as_the_dashboard_does(
    app, runner, smtp_server, monkeypatch
):
    """A sign-up's organisation bears its holder's address: the mail must not read as a person."""
    received, url = smtp_server
    monkeypatch.setitem(app.config, "SMTP_URL", url)
    holder, member = email(), email()
    run(runner, "accounts", "create", holder)

    run(runner, "orgs", "invite", holder, member)

    (message,) = received
    assert message["Subject"] == f"Join {holder}'s organisation"
    assert f"invites you to {holder}'s organisation." in message.get_payload(decode=True).decode()


def test_an_invite_is_mailed_when_smtp_is_set_with_a_link_under_public_url(
    app, runner, smtp_server, monkeypatch
):
    received, url = smtp_server
    monkeypatch.setitem(app.config, "SMTP_URL", url)
    monkeypatch.setitem(app.config, "PUBLIC_URL", "https://gateway.example/")
    monkeypatch.delenv("PUBLIC_URL", raising=False)
    name, member = f"Team {uuid.uuid4().hex[:6]}", email()
    run(runner, "orgs", "create", name, "--owner", email())

    printed = run(runner, "orgs", "invite", name, member).splitlines()
    link = printed[-1]
    assert link.startswith("https://gateway.example/invite/")
    assert f"mailed to {member}" in printed[0]
    (message,) = received
    assert message["To"] == member and message["Subject"] == f"Join {name}"
    assert link in message.get_payload()
    path = link.removeprefix("https://gateway.example")
    assert post_form(new_client(app), path, path, {"password": PASSWORD}).status_code == 302


def test_an_invite_whose_mail_fails_is_still_printed_with_a_warning(app, runner, monkeypatch):
    monkeypatch.setitem(app.config, "SMTP_URL", "smtp://127.0.0.1:9")  # nothing listens
    name = f"Team {uuid.uuid4().hex[:6]}"
    run(runner, "orgs", "create", name, "--owner", email())
    result = runner.invoke(args=["orgs", "invite", name, email()])
    assert result.exit_code == 0, result.output
    assert "/invite/" in result.stdout.splitlines()[-1]
    assert "could not be e-mailed" in result.stderr
