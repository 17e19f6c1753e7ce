"""Migration 0025 on a database 0024 filled: invites get their address, webhook passwords move.

An invite keeps working, bound to its person's address, as the operator's; a webhook
URL's ``user:password@`` leaves the stored URL and the changes log, sealed apart.
"""

from __future__ import annotations

import json

from flask_migrate import downgrade, upgrade
from sqlalchemy import text

from app import create_app
from app.accounts.invites import find_open_invite
from app.accounts.links import new_token
from app.alerts.secrets import seal, unseal
from app.database import utcnow
from app.extensions import db
from tests.conftest import TEST_CATALOG

URL = "https://hook-user:pa55-w0rd@hooks.example/in"


def fill_at_0024() -> str:
    """Write an invite, a webhook with a password and its change as 0024 stored them."""
    now = utcnow()
    db.session.execute(
        text(
            "INSERT INTO accounts (id, email, name, balance, reserved, created_at) "
            "VALUES (1, 'owner@example.com', 'Team', 0, 0, :now)"
        ),
        {"now": now},
    )
    db.session.execute(
        text(
            "INSERT INTO people (id, email, is_admin, created_at) "
            "VALUES (7, 'invited@example.com', false, :now)"
        ),
        {"now": now},
    )
    token, digest = new_token()
    db.session.execute(
        text(
            "INSERT INTO account_invites (account_id, person_id, role, token_digest, "
            "created_at, expires_at) VALUES (1, 7, 'member', :digest, :now, :later)"
        ),
        {"digest": digest, "now": now, "later": now.replace(year=now.year + 1)},
    )
    db.session.execute(
        text(
            "INSERT INTO alert_endpoints (account_id, kind, target, sealed_secret, created_at) "
            "VALUES (1, 'webhook', :url, :secret, :now)"
        ),
        {"url": URL, "secret": seal("whsec_x"), "now": now},
    )
    db.session.execute(
        text(
            "INSERT INTO changes (account_id, action, subject, detail, created_at) "
            "VALUES (1, 'alerts.webhook.add', 'endpoint:1', :detail, :now)"
        ),
        {"detail": json.dumps({"target": URL}), "now": now},
    )
    db.session.commit()
    return token


def test_invites_and_webhook_passwords_survive_up_and_down(empty_database_url):
    app = create_app(
        "testing", {"SQLALCHEMY_DATABASE_URI": empty_database_url, "MODEL_CATALOG": TEST_CATALOG}
    )
    with app.app_context():
        upgrade(revision="0024")
        token = fill_at_0024()
        upgrade()

        invite = find_open_invite(token)
        assert (invite.email, invite.role, invite.from_operator) == (
            "invited@example.com",
            "member",
            True,
        )
        target, sealed = db.session.execute(
            text("SELECT target, sealed_userinfo FROM alert_endpoints")
        ).one()
        assert target == "https://hooks.example/in"
        assert unseal(sealed) == "hook-user:pa55-w0rd"
        detail = db.session.scalar(text("SELECT detail FROM changes"))
        detail = json.loads(detail) if isinstance(detail, str) else detail
        assert detail == {"target": "https://***@hooks.example/in"}
        db.session.commit()

        downgrade(revision="0024")
        person = db.session.scalar(text("SELECT person_id FROM account_invites"))
        db.session.commit()  # the next migration runs on a connection of its own
        assert person == 7
        upgrade()
