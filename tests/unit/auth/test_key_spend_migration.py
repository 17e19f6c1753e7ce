"""Migration 0008: an unlimited key's row takes its spend this month from its generations."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from decimal import Decimal

from flask_migrate import upgrade
from sqlalchemy import column, insert, select, table, update

from app import create_app
from app.accounts.models import Membership
from app.auth.models import ApiKey
from app.budgets import unix_micros
from app.credits.balances import month_start
from app.database import utcnow
from app.extensions import db
from app.generations.models import Generation
from tests.conftest import TEST_CATALOG
from tests.previous_release import API_KEYS_AT_0018, insert_account, insert_key

# The generations table as revision 0007 has it: the model has columns added since.
GENERATIONS_AT_0007 = table(
    "generations",
    *(
        column(name, Generation.__table__.c[name].type)
        for name in (
            "id", "account_id", "api_key_id", "model", "completion_tokens", "price_completion",
            "cost", "status", "created_at", "prompt_tokens", "cached_tokens",
            "prompt_image_tokens", "reasoning_tokens", "price_prompt", "price_cached_read",
            "price_image", "streamed", "estimated", "latency_ms",
        )
    ),
)  # fmt: skip


def charge(account_id: int, key_id: int, cost: str, created_at) -> None:
    """Record a generation of the key that was charged ``cost``."""
    db.session.execute(
        insert(GENERATIONS_AT_0007),
        {
            "id": f"gen-{uuid.uuid4().hex}",
            "account_id": account_id,
            "api_key_id": key_id,
            "model": "dev-chat",
            "completion_tokens": 1000,
            "price_completion": Decimal(cost) * 1000,
            "cost": Decimal(cost),
            "status": "completed",
            "created_at": created_at,
            **dict.fromkeys(("prompt_tokens", "cached_tokens", "prompt_image_tokens"), 0),
            **dict.fromkeys(("reasoning_tokens", "latency_ms"), 0),
            **dict.fromkeys(("price_prompt", "price_cached_read", "price_image"), Decimal(0)),
            "streamed": False,
            "estimated": False,
        },
    )


def test_an_unlimited_keys_month_is_taken_from_its_generations(empty_database_url):
    app = create_app(
        "testing", {"SQLALCHEMY_DATABASE_URI": empty_database_url, "MODEL_CATALOG": TEST_CATALOG}
    )
    with app.app_context():
        upgrade(revision="0007")
        account_id = insert_account(f"{uuid.uuid4().hex}@example.com")
        unlimited, _ = insert_key(account_id, "unlimited")
        limited, _ = insert_key(account_id, "limited", monthly_limit=Decimal("5"))
        idle, _ = insert_key(account_id, "idle")
        now = utcnow()
        for key_id in (unlimited, limited):
            charge(account_id, key_id, "0.25", now)
            charge(account_id, key_id, "7", month_start(now) - timedelta(seconds=1))
        # The limited key's row was kept by the ledger: the migration leaves it alone.
        db.session.execute(
            update(API_KEYS_AT_0018)
            .where(API_KEYS_AT_0018.c.id == limited)
            .values(month_spent=Decimal("0.5"))
        )
        db.session.execute(update(API_KEYS_AT_0018).values(spend_month=spend_month(now) - 1))
        db.session.commit()

        upgrade(revision="0008")

        columns = API_KEYS_AT_0018.c
        rows = {
            row.id: row
            for row in db.session.execute(
                select(columns.id, columns.month_spent, columns.spend_month)
            )
        }
        assert rows[unlimited].month_spent == Decimal("0.25")
        assert rows[unlimited].spend_month == spend_month(now)
        assert rows[idle].month_spent == 0
        assert rows[idle].spend_month == spend_month(now)
        assert rows[limited].month_spent == Decimal("0.5")
        assert rows[limited].spend_month == spend_month(now) - 1

        # Revision 0020 makes the month a budget window: a key that last spent in an
        # earlier month starts this one at zero.
        db.session.commit()  # the migrations take its tables' locks
        upgrade()
        keys = {key.id: key for key in db.session.scalars(select(ApiKey))}
        assert keys[limited].budget == Decimal("5") and keys[limited].budget_window == "month"
        assert keys[limited].window_spent == 0 and keys[unlimited].window_spent == Decimal("0.25")
        assert {key.window_start for key in keys.values()} == {unix_micros(month_start(now))}
        members = db.session.execute(select(Membership.window_spent, Membership.budget)).all()
        assert members == [(Decimal("0.25"), None)]
        db.session.remove()
        db.engine.dispose()


def spend_month(moment: datetime) -> int:
    """The calendar month (UTC) of ``moment`` as revision 0008 keeps it, ``YYYYMM``."""
    return moment.year * 100 + moment.month
