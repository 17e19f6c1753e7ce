"""Migration 0028: payments' tables, and a balance allowed below zero, then refused again."""

from __future__ import annotations

import pytest
from flask_migrate import downgrade, upgrade
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from app import create_app
from app.extensions import db
from tests.conftest import TEST_CATALOG

SET_BALANCE = text("UPDATE accounts SET balance = :balance WHERE id = :id")
# The balance-below-threshold trigger on accounts, which must survive the change.
ALERTS = text("SELECT count(*) FROM alert_events WHERE account_id = :id")


def insert_account_at_0027() -> int:
    """Insert an account of $1 with 0027's columns (the model's are the head's); return its id."""
    inserted = db.session.execute(
        text(
            "INSERT INTO accounts (name, email, balance, reserved, budget_alert_percent,"
            " created_at) VALUES ('at 0027', 'at-0027@example.com', :balance, 0, 80,"
            " CURRENT_TIMESTAMP) RETURNING id"
        ),
        {"balance": 10**10},
    )
    account_id = inserted.scalar_one()
    db.session.commit()
    return account_id


def test_the_balance_may_go_below_zero_and_the_tables_come_and_go(empty_database_url):
    app = create_app(
        "testing", {"SQLALCHEMY_DATABASE_URI": empty_database_url, "MODEL_CATALOG": TEST_CATALOG}
    )
    with app.app_context():
        upgrade(revision="0027")
        account_id = insert_account_at_0027()
        with pytest.raises(IntegrityError):
            db.session.execute(SET_BALANCE, {"balance": -1, "id": account_id})
        db.session.rollback()

        upgrade()
        tables = set(inspect(db.engine).get_table_names())
        assert {"payment_orders", "stripe_events", "redemption_codes"} <= tables
        db.session.execute(
            text("UPDATE accounts SET alert_below = 5 WHERE id = :id"), {"id": account_id}
        )
        db.session.execute(SET_BALANCE, {"balance": -(10**10), "id": account_id})
        db.session.commit()
        assert db.session.scalar(
            text("SELECT balance FROM accounts WHERE id = :id"), {"id": account_id}
        ) == -(10**10)
        # The account's triggers are still there: the fall below the threshold is alerted.
        assert db.session.scalar(ALERTS, {"id": account_id}) >= 1
        # Its foreign keys still hold.
        with pytest.raises(IntegrityError):
            db.session.execute(
                text(
                    "INSERT INTO payment_orders (id, account_id, kind, amount, fee, total_cents,"
                    " currency, status, created_at) VALUES ('ord_x', 999999, 'checkout', 1, 0,"
                    " 100, 'usd', 'pending', '2026-01-01')"
                )
            )
        db.session.rollback()

        db.session.execute(SET_BALANCE, {"balance": 0, "id": account_id})
        db.session.commit()
        downgrade(revision="0027")
        assert "payment_orders" not in set(inspect(db.engine).get_table_names())
        with pytest.raises(IntegrityError):
            db.session.execute(SET_BALANCE, {"balance": -1, "id": account_id})
        db.session.rollback()
        db.engine.dispose()
