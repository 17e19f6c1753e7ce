"""Tables partitioned by month on PostgreSQL: adding the months ahead, dropping old ones.

PostgreSQL keeps generations and idempotent_requests in one partition per calendar
month (UTC) of their ``created_at`` (migration 0018), so that pruning old rows drops
whole partitions instead of deleting rows one by one. Partitions are added ahead of
time: a row whose month has none would be refused. Both steps stay out of requests'
way: a partition is created as a table of its own and then attached, and detached
CONCURRENTLY before it is dropped, which take no lock that reads or writes wait for
(PostgreSQL 14 or later). On SQLite, and for a table that is not partitioned, they do
nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.engine import Connection

from app.extensions import db

log = logging.getLogger(__name__)

_BOUND = re.compile(r"FROM \((MINVALUE|'[^']+')\) TO \('([^']+)'\)")


@dataclass(frozen=True)
class Partition:
    """One month's partition (or the first, open below): its name and its time range."""

    name: str
    lower: datetime | None
    upper: datetime


def month_after(moment: datetime) -> datetime:
    """Return the first instant of the calendar month after the one ``moment`` falls in."""
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


def month_partition_name(table: str, lower: datetime) -> str:
    """Return the name of ``table``'s partition of the month starting at ``lower``."""
    return f"{table}_{lower:%Y_%m}"


def partitions_of(connection: Connection, table: str) -> list[Partition] | None:
    """Return ``table``'s partitions, oldest first; None if it is not partitioned."""
    if connection.dialect.name != "postgresql" or not _is_partitioned(connection, table):
        return None
    rows = connection.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:table) AND NOT i.inhdetachpending"
        ),
        {"table": table},
    ).all()
    partitions = [_partition(name, bound) for name, bound in rows]
    return sorted(partitions, key=lambda partition: partition.upper)


def _is_partitioned(connection: Connection, table: str) -> bool:
    return bool(
        connection.execute(
            text("SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(:table)"),
            {"table": table},
        ).first()
    )


def _partition(name: str, bound: str) -> Partition:
    lower, upper = _BOUND.search(bound).groups()
    return Partition(name, None if lower == "MINVALUE" else _moment(lower[1:-1]), _moment(upper))


def _moment(literal: str) -> datetime:
    return datetime.fromisoformat(literal).replace(tzinfo=UTC)


def add_month_partitions(table: str, *, since: datetime, through: datetime) -> list[str]:
    """Give ``table`` a partition for every month from ``since``'s to ``through``'s it lacks.

    Return the names of the partitions added. Each is created as a table of its own
    (LIKE the parent) and attached, which locks the parent only against other schema
    changes, never against its reads and writes.
    """
    added: list[str] = []
    with _autocommit(table) as connection:
        partitions = connection and partitions_of(connection, table)
        if not partitions:
            return added
        lower = since.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        while lower <= through:
            upper = month_after(lower)
            if not any(_covers(partition, lower) for partition in partitions):
                added.append(_attach_month(connection, table, lower, upper))
            lower = upper
    return added


def _covers(partition: Partition, moment: datetime) -> bool:
    return (partition.lower is None or partition.lower <= moment) and moment < partition.upper


def _attach_month(connection: Connection, table: str, lower: datetime, upper: datetime) -> str:
    name = month_partition_name(table, lower)
    bounds = f"FROM ('{lower:%Y-%m-%d}') TO ('{upper:%Y-%m-%d}')"
    connection.execute(text(f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS)"))
    connection.execute(text(f"ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES {bounds}"))
    log.info("added the partition %s of %s", name, table)
    return name


def drop_partitions_before(table: str, moment: datetime) -> list[str]:
    """Drop ``table``'s partitions whose every row is older than ``moment``; return their names.

    The newest partition always stays, so that the table keeps a place for new rows.
    """
    dropped: list[str] = []
    with _autocommit(table) as connection:
        if connection is None:
            return dropped
        dropped += _finish_detaching(connection, table)
        partitions = partitions_of(connection, table) or []
        for partition in partitions[:-1]:
            if partition.upper > moment:
                break
            connection.execute(
                text(f"ALTER TABLE {table} DETACH PARTITION {partition.name} CONCURRENTLY")
            )
            connection.execute(text(f"DROP TABLE {partition.name}"))
            log.info("dropped the partition %s of %s", partition.name, table)
            dropped.append(partition.name)
    return dropped


def _finish_detaching(connection: Connection, table: str) -> list[str]:
    """Finish the DETACH ... CONCURRENTLY that were interrupted; drop what they detached."""
    pending = connection.scalars(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:table) AND i.inhdetachpending"
        ),
        {"table": table},
    ).all()
    for name in pending:
        connection.execute(text(f"ALTER TABLE {table} DETACH PARTITION {name} FINALIZE"))
        connection.execute(text(f"DROP TABLE {name}"))
    return list(pending)


@contextmanager
def _autocommit(table: str) -> Iterator[Connection | None]:
    """Yield a connection in autocommit (DETACH ... CONCURRENTLY runs in no transaction).

    None on a database that partitions nothing, or while another process changes
    ``table``'s partitions (every worker's sweeper tries): this one leaves it to that one.
    """
    if db.engine.dialect.name != "postgresql":
        yield None
        return
    with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        name = {"name": f"partitions of {table}"}
        if not connection.scalar(text(_TRY_LOCK), name):
            yield None
            return
        try:
            yield connection
        finally:
            connection.execute(text(_UNLOCK), name)


_TRY_LOCK = "SELECT pg_try_advisory_lock(hashtextextended(:name, 0))"
_UNLOCK = "SELECT pg_advisory_unlock(hashtextextended(:name, 0))"
