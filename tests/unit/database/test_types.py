"""The shared column types write what SQLAlchemy's own processing of them would write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from sqlalchemy import text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.types import TypeDecorator

from app.accounts.keys import create_key
from app.auth.models import ApiKey
from app.database import (
    Money,
    UTCDateTime,
    execute_on_driver,
    write_transaction,
)
from app.extensions import db
from app.money import money_units
from tests.factories import AccountFactory

DIALECTS = [sqlite.dialect(), postgresql.psycopg.dialect()]
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
@pytest.mark.parametrize(
    ("column_type", "values"),
    [(Money(), [*AMOUNTS, None]), (UTCDateTime(), [*TIMES, None])],
    ids=["money", "time"],
)
def test_values_bind_as_sqlalchemy_would_bind_them(column_type, values, dialect):
    processor = column_type.dialect_impl(dialect).bind_processor(dialect)
    composed = _composed(column_type, dialect)

    for value in values:
        assert processor(value) == composed(value)


def test_money_binds_as_units_of_the_quantum_rounded_half_up():
    dialect = sqlite.dialect()
    processor = Money().dialect_impl(dialect).bind_processor(dialect)

    assert [processor(amount) for amount in AMOUNTS] == [
        360_000,
        1,
        -1,
        0,
        1_234_567_891_234_567_891,
        -25_000_000_000,
        0,
        70_000_000_000,
    ]
    assert money_units(None) is None


def test_sqlite_keeps_a_time_as_naive_utc_text_to_the_microsecond():
    dialect = sqlite.dialect()
    processor = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)

    assert processor(TIMES[0]) == "2026-11-25 19:54:54.868378"
    assert processor(TIMES[1]) == "2026-11-25 19:54:54.000000"
    assert processor(TIMES[2]) == "2026-03-28 23:30:00.000005"


def test_json_columns_are_written_compact_by_every_engine(app_context):
    account = AccountFactory.create()
    issued = create_key(account_id=account.id, name="json")
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
