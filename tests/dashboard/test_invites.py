"""Operators' invites and the commands that give accounts a dashboard sign-in."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from sqlalchemy import update

from app.accounts.links import token_digest
from app.accounts.models import PasswordLink
from app.database import utcnow
from app.extensions import db
from config.settings import ConfigurationError, config_class, settings_from_environment
from tests.dashboard.conftest import PASSWORD, csrf_token, new_client, new_email, sign_in


def invite(runner, email: str) -> str:
    """Run ``flask accounts invite`` and return the link's path."""
    result = runner.invoke(args=["accounts", "invite", email, "--base-url", "https://gw.test/"])
    assert result.exit_code == 0, result.output
    link = result.output.strip().splitlines()[-1]
    assert link.startswith("https://gw.test/password/")
    return link.removeprefix("https://gw.test")


def set_password(client, path: str, password: str = PASSWORD):
    token = csrf_token(client.get(path).text)
    return client.post(path, data={"csrf_token": token, "password": password})


def test_an_operators_account_signs_in_after_its_invite(app, runner):
    email = new_email()
    assert runner.invoke(args=["accounts", "create", email]).exit_code == 0
    assert sign_in(new_client(app), email).status_code == 401, "no password before the invite"
    path = invite(runner, email)
    client = new_client(app)
    assert set_password(client, path, "short").status_code == 400
    assert set_password(client, path).status_code == 302
    assert client.get("/keys").status_code == 200
    assert sign_in(new_client(app), email).status_code == 302


def test_an_invite_works_once(app, runner):
    path = invite(runner, new_email())
    assert set_password(new_client(app), path).status_code == 302
    reused = new_client(app).get(path)
    assert reused.status_code == 404 and "not valid" in reused.text


def test_an_invite_expires_after_24_hours(app, runner):
    path = invite(runner, new_email())
    with app.app_context():
        db.session.execute(
            update(PasswordLink)
            .where(PasswordLink.token_digest == token_digest(path.rsplit("/", 1)[1]))
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
        db.session.commit()
    assert new_client(app).get(path).status_code == 404


def test_only_the_invite_tokens_digest_is_stored(app, runner):
    path = invite(runner, new_email())
    token = path.rsplit("/", 1)[1]
    with app.app_context():
        digests = db.session.scalars(db.select(PasswordLink.token_digest)).all()
    assert token not in digests and all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests)


def test_signup_defaults_open_in_development_and_closed_in_production():
    assert config_class("development").SIGNUP == "open"
    assert config_class("production").SIGNUP == "closed"
    assert settings_from_environment({"SIGNUP": "closed"})["SIGNUP"] == "closed"
    with pytest.raises(ConfigurationError, match="SIGNUP"):
        settings_from_environment({"SIGNUP": "maybe"})
