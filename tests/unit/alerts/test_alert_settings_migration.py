"""Migration 0022: the budget alert's percentage per organisation, and back to a fixed 80."""

from __future__ import annotations

import json
from decimal import Decimal

from flask_migrate import downgrade, upgrade
from sqlalchemy import text

from app import create_app
from app.extensions import db
from tests.conftest import TEST_CATALOG
from tests.factories import AccountFactory


def spend_on_key(key_id: int, spent_units: int) -> None:
    """Set the key's window spend, as a settlement's UPDATE OF window_spent does."""
    db.session.execute(
        text("UPDATE api_keys SET window_spent = :spent WHERE id = :id"),
        {"spent": spent_units, "id": key_id},
    )
    db.session.commit()


def early_alert_percents(account_id: int) -> list[int]:
    rows = db.session.execute(
        text("SELECT data FROM alert_events WHERE account_id = :id AND type = :type ORDER BY id"),
        {"id": account_id, "type": "budget.threshold_reached"},
    )
    return [json.loads(data)["percent"] for (data,) in rows]


def test_the_percentage_survives_up_and_down(empty_database_url):
    app = create_app(
        "testing", {"SQLALCHEMY_DATABASE_URI": empty_database_url, "MODEL_CATALOG": TEST_CATALOG}
    )
    with app.app_context():
        upgrade()
        account, key = AccountFactory.with_key(credits=Decimal("10"))
        account_id, key_id = account.id, key.id
        db.session.execute(
            text("UPDATE api_keys SET budget = 1000, window_start = 1 WHERE id = :id"),
            {"id": key_id},
        )
        db.session.commit()
        downgrade(revision="0021")
        spend_on_key(key_id, 800)
        assert early_alert_percents(account_id) == [80]

        upgrade()
        percent = text("SELECT budget_alert_percent FROM accounts WHERE id = :id")
        assert db.session.scalar(percent, {"id": account_id}) == 80
        db.session.execute(
            text("UPDATE accounts SET budget_alert_percent = 90 WHERE id = :id"), {"id": account_id}
        )
        spend_on_key(key_id, 0)
        spend_on_key(key_id, 850)
        assert early_alert_percents(account_id) == [80]
        spend_on_key(key_id, 900)
        assert early_alert_percents(account_id) == [80, 90]
        db.session.remove()
