"""generations and idempotent_requests partitioned by month on PostgreSQL

So that pruning old rows (GENERATION_RETENTION_DAYS, the 24 hours of Idempotency-Key
records) drops whole partitions instead of deleting rows one by one. Each table is
converted in place, its rows never copied:

1. online, while reads and writes go on: a unique index on (id, created_at), and any
   index the partitioned table has that the old one lacks, built CONCURRENTLY; a CHECK
   that every row is older than the boundary (the first of the month after the table's
   newest row and after tomorrow), added NOT VALID (a moment's ACCESS EXCLUSIVE lock)
   and then validated (a scan under SHARE UPDATE EXCLUSIVE, which blocks no read or
   write);
2. in one short transaction holding the old table's ACCESS EXCLUSIVE lock (every read
   and write of it waits that long) and SHARE ROW EXCLUSIVE on accounts and api_keys (for
   the new foreign keys: their holds and settlements wait too): the old table is renamed
   and becomes the first partition, below the boundary, with the indexes it has (no
   scan, no index built); months from the boundary on get partitions of their own. Each
   lock waits at most lock_timeout (10 s): a busy database fails the migration rather
   than stall its requests, and it can be run again (a table converted already is
   left as it is, an index left invalid by an interrupted build is built again).

A partition's primary key must include the partition key: (id, created_at). A generation
is still recorded once (the ledger looks for its record by id when its hold was not open,
app.credits.settlement), and an Idempotency-Key claimed once (claims take an advisory lock,
app.generations.idempotency). Lookups by id alone probe each month's index. The sweeper
adds the coming months and drops the expired ones (app.database.partitions). SQLite is
left as it is.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28 14:00:00

"""

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# The months after the boundary that get their partition now; the sweeper adds more.
MONTHS_AHEAD = timedelta(days=183)
LOCK_TIMEOUT = "10s"


@dataclass(frozen=True)
class Table:
    """What a table has besides its columns, as its partitioned successor must have it."""

    name: str
    indexes: dict[str, str]
    foreign_keys: dict[str, str]
    # What the table had that its partitioned successor has not, and what it gets anew.
    unique: dict[str, str] = field(default_factory=dict)
    new_indexes: dict[str, str] = field(default_factory=dict)
    sequence: str | None = None


TABLES = (
    Table(
        "generations",
        indexes={
            "ix_generations_account_id_created_at": "(account_id, created_at)",
            "ix_generations_api_key_id": "(api_key_id)",
        },
        foreign_keys={
            "fk_generations_account_id_accounts": "FOREIGN KEY (account_id) REFERENCES accounts (id)",
            "fk_generations_api_key_id_api_keys": (
                "FOREIGN KEY (api_key_id) REFERENCES api_keys (id) ON DELETE SET NULL"
            ),
        },
    ),
    Table(
        "idempotent_requests",
        indexes={"ix_idempotent_requests_created_at": "(created_at)"},
        foreign_keys={
            "fk_idempotent_requests_account_id_accounts": (
                "FOREIGN KEY (account_id) REFERENCES accounts (id)"
            ),
        },
        unique={"uq_idempotent_requests_account_id_key": "(account_id, key)"},
        # Claims are found by account and key; one claim per key is kept by a lock.
        new_indexes={"ix_idempotent_requests_account_id_key": "(account_id, key)"},
        sequence="idempotent_requests_id_seq",
    ),
)


def month_after(moment):
    year, month = (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


def upgrade():
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        if _is_partitioned(table):
            continue
        boundary = _boundary(table)
        first = f"{table.name}_before_{boundary:%Y_%m}"
        _prepare_online(table, first, boundary)
        _become_partitioned(table, first, boundary)


def _is_partitioned(table):
    found = op.get_bind().exec_driver_sql(
        f"SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass('{table.name}')"
    )
    return found.first() is not None


def _boundary(table):
    """Return the first partition's upper bound: past the table's rows and tomorrow's.

    No row written while the migration runs, nor any row dated ahead, is past it.
    """
    latest = op.get_bind().exec_driver_sql(f"SELECT max(created_at) FROM {table.name}").scalar()
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    return month_after(max(tomorrow, latest.replace(tzinfo=UTC)) if latest else tomorrow)


def _prepare_online(table, first, boundary):
    """Build what the first partition needs without blocking reads or writes."""
    indexes = {
        f"{first}_id_created_at": "UNIQUE INDEX",
        **{_renamed(name, table, first): "INDEX" for name in table.new_indexes},
    }
    columns = {
        f"{first}_id_created_at": "(id, created_at)",
        **{
            _renamed(name, table, first): definition
            for name, definition in table.new_indexes.items()
        },
    }
    with op.get_context().autocommit_block():
        for name, kind in indexes.items():
            _drop_if_invalid(name)
            op.execute(
                f"CREATE {kind} CONCURRENTLY IF NOT EXISTS {name} ON {table.name} {columns[name]}"
            )
        op.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        op.execute(f"ALTER TABLE {table.name} DROP CONSTRAINT IF EXISTS {first}_bound")
        op.execute(
            f"ALTER TABLE {table.name} ADD CONSTRAINT {first}_bound "
            f"CHECK (created_at < '{boundary:%Y-%m-%d}') NOT VALID"
        )
        op.execute("RESET lock_timeout")
        op.execute(f"ALTER TABLE {table.name} VALIDATE CONSTRAINT {first}_bound")


def _drop_if_invalid(name):
    """Drop the index ``name`` if a build of it was interrupted (it is left invalid)."""
    invalid = op.get_bind().exec_driver_sql(
        f"SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('{name}') AND NOT indisvalid"
    )
    if invalid.first() is not None:
        op.execute(f"DROP INDEX CONCURRENTLY {name}")


def _become_partitioned(table, first, boundary):
    """Rename the table, make a partitioned one of its name, attach the old one to it."""
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    op.execute(f"ALTER TABLE {table.name} RENAME TO {first}")
    op.execute(f"ALTER TABLE {first} DROP CONSTRAINT pk_{table.name}")
    for name in table.unique:
        op.execute(f"ALTER TABLE {first} DROP CONSTRAINT {name}")
    op.execute(
        f"ALTER TABLE {first} ADD CONSTRAINT {first}_pkey "
        f"PRIMARY KEY USING INDEX {first}_id_created_at"
    )
    op.execute(f"ALTER TABLE {first} DROP CONSTRAINT {first}_bound")
    for name in table.indexes:
        op.execute(f"ALTER INDEX IF EXISTS {name} RENAME TO {_renamed(name, table, first)}")
    for name in table.foreign_keys:
        op.execute(
            f"ALTER TABLE {first} RENAME CONSTRAINT {name} TO {_renamed(name, table, first)}"
        )
    _create_parent(table, first)
    op.execute(
        f"ALTER TABLE {table.name} ATTACH PARTITION {first} "
        f"FOR VALUES FROM (MINVALUE) TO ('{boundary:%Y-%m-%d}')"
    )
    _add_months(table.name, boundary, datetime.now(UTC) + MONTHS_AHEAD)


def _create_parent(table, first):
    """Create the partitioned table, with the keys and indexes the old one has."""
    op.execute(
        f"CREATE TABLE {table.name} (LIKE {first} INCLUDING DEFAULTS) "
        "PARTITION BY RANGE (created_at)"
    )
    op.execute(
        f"ALTER TABLE {table.name} ADD CONSTRAINT pk_{table.name} PRIMARY KEY (id, created_at)"
    )
    for name, columns in {**table.indexes, **table.new_indexes}.items():
        op.execute(f"CREATE INDEX {name} ON {table.name} {columns}")
    for name, definition in table.foreign_keys.items():
        op.execute(f"ALTER TABLE {table.name} ADD CONSTRAINT {name} {definition}")
    if table.sequence:
        # The sequence outlives the first partition, which is dropped some day.
        op.execute(f"ALTER SEQUENCE {table.sequence} OWNED BY {table.name}.id")


def _renamed(name, table, first):
    """Return the name ``name`` (an index or constraint of ``table``) takes on the old rows."""
    return first + name.split(table.name, 1)[1]


def _add_months(table, start, through):
    lower = start
    while lower <= through:
        upper = month_after(lower)
        op.execute(
            f"CREATE TABLE {table}_{lower:%Y_%m} PARTITION OF {table} "
            f"FOR VALUES FROM ('{lower:%Y-%m-%d}') TO ('{upper:%Y-%m-%d}')"
        )
        lower = upper


def downgrade():
    """Copy the rows back into plain tables: offline, each table locked while it is copied."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        plain = f"{table.name}_unpartitioned"
        op.execute(f"LOCK TABLE {table.name} IN ACCESS EXCLUSIVE MODE")
        op.execute(f"CREATE TABLE {plain} (LIKE {table.name} INCLUDING DEFAULTS)")
        op.execute(f"INSERT INTO {plain} SELECT * FROM {table.name}")
        if table.sequence:
            op.execute(f"ALTER SEQUENCE {table.sequence} OWNED BY {plain}.id")
        op.execute(f"DROP TABLE {table.name}")
        op.execute(f"ALTER TABLE {plain} RENAME TO {table.name}")
        op.execute(f"ALTER TABLE {table.name} ADD CONSTRAINT pk_{table.name} PRIMARY KEY (id)")
        for name, columns in table.unique.items():
            op.execute(f"ALTER TABLE {table.name} ADD CONSTRAINT {name} UNIQUE {columns}")
        for name, columns in table.indexes.items():
            op.execute(f"CREATE INDEX {name} ON {table.name} {columns}")
        for name, definition in table.foreign_keys.items():
            op.execute(f"ALTER TABLE {table.name} ADD CONSTRAINT {name} {definition}")
