"""The shared column types write what SQLAlchemy's own processing of them would write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from sqlalchemy import text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator

from app.auth.keys import create_key
from app.auth.models import ApiKey
from app.credits.pricing import to_money
from app.database import (
    UNITS_PER_USD,
    Money,
    UTCDateTime,
    execute_on_driver,
    money_units,
    write_transaction,
)
from app.extensions import db
from tests.factories import AccountFactory

DIALECTS = [sqlite.dialect(), postgresql.psycopg2.dialect()]
AMOUNTS = [
    Decimal("0.0000360000"),
    Decimal("0.00000000005"),  # a tie at the quantum: rounded half up, away from zero
    Decimal("-0.00000000005"),
    Decimal("0.000000000049999"),
    Decimal("123456789.12345678905"),
    Decimal("-2.5"),
    Decimal(0),
    7,
]
TIMES = [
    datetime(2026, 11, 25, 19, 54, 54, 868378, tzinfo=UTC),
    datetime(2026, 11, 25, 19, 54, 54, tzinfo=UTC),  # no microseconds: still six digits
    datetime(2026, 3, 29, 1, 30, 0, 5, tzinfo=timezone(timedelta(hours=2))),
    datetime(2026, 1, 1, 0, 0, 0, 1),  # naive: local time, as astimezone reads it
]


def _composed(column_type: TypeDecorator, dialect):  # noqa: ANN001, ANN202
    """SQLAlchemy's processing: process_bind_param, then the underlying type's own."""
    return TypeDecorator.bind_processor(column_type.dialect_impl(dialect), dialect)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda dialect: dialect.driver)
def test_money_binds_the_units_sqlalchemy_would(dialect):
    processor = Money().dialect_impl(dialect).bind_processor(dialect)
    composed = _composed(Money(), dialect)

    for amount in [*AMOUNTS, None]:
        assert processor(amount) == composed(amount)
    for amount in AMOUNTS:
        assert processor(amount) == int(to_money(Decimal(amount)) * UNITS_PER_USD)


def test_money_units_round_half_up_at_the_quantum():
    assert money_units(Decimal("0.00000000005")) == 1
    assert money_units(Decimal("-0.00000000005")) == -1
    assert money_units(Decimal("0.000000000049999")) == 0
    assert money_units(None) is None


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda dialect: dialect.driver)
def test_times_bind_as_sqlalchemy_would(dialect):
    processor = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    composed = _composed(UTCDateTime(), dialect)

    for moment in [*TIMES, None]:
        assert processor(moment) == composed(moment)


def test_sqlite_keeps_a_time_as_naive_utc_text_to_the_microsecond():
    dialect = sqlite.dialect()
    processor = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)

    assert processor(TIMES[0]) == "2026-11-25 19:54:54.868378"
    assert processor(TIMES[1]) == "2026-11-25 19:54:54.000000"
    assert processor(TIMES[2]) == "2026-03-28 23:30:00.000005"


def test_json_columns_are_written_compact_by_every_engine(app_context):
    account = AccountFactory.create()
    issued = create_key(email=account.email, name="json")
    models = ["dev-chat-mini", "dev-chat"]
    # The hot path's writes (on SQLite, the writer's own engine) ...
    write_transaction(
        lambda connection: execute_on_driver(
            connection,
            update(ApiKey).where(ApiKey.id == issued.id).values(permitted_models=models),
            {},
        )
    )
    stored = text("SELECT CAST(permitted_models AS TEXT) FROM api_keys WHERE id = :id")
    assert db.session.scalar(stored, {"id": issued.id}) == '["dev-chat-mini","dev-chat"]'
    # ... and the session's.
    key = db.session.get(ApiKey, issued.id)
    key.permitted_models = list(reversed(models))
    db.session.commit()
    assert db.session.scalar(stored, {"id": issued.id}) == '["dev-chat","dev-chat-mini"]'
    db.session.expire_all()
    assert db.session.get(ApiKey, issued.id).permitted_models == ["dev-chat", "dev-chat-mini"]
