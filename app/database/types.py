"""Column types every model uses: exact money, aware UTC times; and the clock they are read with."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Executable,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from app.money import UNITS_PER_USD, money_units

BoundStatement = tuple[Executable, dict[str, Any]]
"""A statement built once, and the parameters to execute it with."""


class Money(TypeDecorator):
    """USD as Decimal in Python, stored as an exact integer count of MONEY_QUANTUM.

    Integers keep money exact on SQLite too, whose NUMERIC is a float, and let the
    balance checks run as plain integer comparisons inside one UPDATE.
    """

    impl = BigInteger
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], int | None] | None:
        """Convert with ``money_units`` alone where the integer needs no processing of its own.

        A billed request binds about sixteen amounts; SQLAlchemy's composition of
        process_bind_param with the integer's (absent) processing cost each two calls more.
        """
        if self.impl_instance.bind_processor(dialect) is not None:
            return super().bind_processor(dialect)
        return money_units

    def process_bind_param(self, value: Decimal | int | None, dialect: Any) -> int | None:
        """Decimal USD -> integer units."""
        return money_units(value)

    def process_result_value(self, value: int | None, dialect: Any) -> Decimal | None:
        """Integer units -> Decimal USD."""
        if value is None:
            return None
        return Decimal(value) / UNITS_PER_USD


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def bind_processor(self, dialect: Dialect) -> Callable[[Any], Any] | None:
        """On SQLite, write SQLAlchemy's text for the naive UTC time in one step.

        SQLAlchemy's own SQLite processing formats the time from a dict of its parts,
        after process_bind_param; a billed request writes five times. The text is the
        same (tests/unit/test_database_types.py holds them to it).
        """
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)
        return sqlite_utc_text

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        """Store naive UTC."""
        if value is None:
            return None
        return naive_utc(value)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        """Read back as aware UTC."""
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


def naive_utc(value: datetime) -> datetime:
    """Return ``value`` as naive UTC (a naive ``value`` is read as local time)."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.replace(tzinfo=None)


def sqlite_utc_text(value: datetime | None) -> str | None:
    """Return the text SQLite keeps for ``value``: naive UTC, to the microsecond."""
    if value is None:
        return None
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # The UTC time's text less its "+00:00": the naive time's text, without making the
    # naive time (datetime.replace takes keywords, and costs more than the text).
    return value.isoformat(" ", "microseconds")[:-6]


def utcnow() -> datetime:
    """Return the current time, aware, in UTC."""
    return datetime.now(UTC)
