"""SQL expressions each database spells its own way, for the queries that need them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from app.database.types import UTCDateTime


class utc_hour(FunctionElement):
    """The start of the UTC hour a time column's value falls in, as usage rollups file it."""

    type = UTCDateTime()
    name = "utc_hour"
    inherit_cache = True


@compiles(utc_hour, "postgresql")
def _utc_hour_on_postgresql(element: utc_hour, compiler: Any, **kw: Any) -> str:
    return f"date_trunc('hour', {compiler.process(element.clauses, **kw)})"


@compiles(utc_hour, "sqlite")
def _utc_hour_on_sqlite(element: utc_hour, compiler: Any, **kw: Any) -> str:
    # SQLite keeps times as text (app.database.types.sqlite_utc_text): the hour is the
    # same text with its minutes, seconds and microseconds at zero.
    return f"strftime('%Y-%m-%d %H:00:00.000000', {compiler.process(element.clauses, **kw)})"


class utc_iso_text(FunctionElement):
    """A time column's value as ISO 8601 text in UTC, to the microsecond: ...T...+00:00."""

    type = String()
    name = "utc_iso_text"
    inherit_cache = True


@compiles(utc_iso_text, "postgresql")
def _utc_iso_text_on_postgresql(element: utc_iso_text, compiler: Any, **kw: Any) -> str:
    column = compiler.process(element.clauses, **kw)
    return f"""to_char({column}, 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


@compiles(utc_iso_text, "sqlite")
def _utc_iso_text_on_sqlite(element: utc_iso_text, compiler: Any, **kw: Any) -> str:
    # The stored text is "YYYY-MM-DD HH:MM:SS.ffffff", in UTC.
    return f"replace({compiler.process(element.clauses, **kw)}, ' ', 'T') || '+00:00'"


class later_of(FunctionElement):
    """The greater of two values, a NULL one counting as none: a window start kept or moved on.

    Written once where a CASE comparing them would write each twice.
    """

    name = "later_of"
    inherit_cache = True

    @property
    def type(self) -> Any:
        """The type of the values compared."""
        return self.clauses.clauses[0].type


@compiles(later_of, "postgresql")
def _later_of_on_postgresql(element: later_of, compiler: Any, **kw: Any) -> str:
    return f"GREATEST({compiler.process(element.clauses, **kw)})"


@compiles(later_of, "sqlite")
def _later_of_on_sqlite(element: later_of, compiler: Any, **kw: Any) -> str:
    # SQLite's max() of several values is NULL if any of them is.
    first, second = (compiler.process(clause, **kw) for clause in element.clauses.clauses)
    return f"max(coalesce({first}, {second}), {second})"


class sha256_hex(FunctionElement):
    """The SHA-256 of a text's UTF-8 bytes, as 64 lower-case hex digits.

    PostgreSQL has sha256(bytea); SQLite has none, and each of its connections is given
    one (app.database.sqlite.sha256_hex_of), so that the two compute the same digest.
    """

    type = String()
    name = "sha256_hex"
    inherit_cache = True


@compiles(sha256_hex, "postgresql")
def _sha256_hex_on_postgresql(element: sha256_hex, compiler: Any, **kw: Any) -> str:
    text = compiler.process(element.clauses, **kw)
    return f"encode(sha256(convert_to({text}, 'UTF8')), 'hex')"


@compiles(sha256_hex, "sqlite")
def _sha256_hex_on_sqlite(element: sha256_hex, compiler: Any, **kw: Any) -> str:
    return f"sha256_hex({compiler.process(element.clauses, **kw)})"
