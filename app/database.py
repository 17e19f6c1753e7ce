"""The database: shared column types, engines and pools, and how the hot path runs.

Every package's models use the column types here. The hot path's statements are
compiled once and handed to the driver; on PostgreSQL they run alone (in autocommit,
prepared), and on SQLite its writes run in transactions that take the write lock
without putting the worker to sleep.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import deque, namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from flask import Flask, current_app
from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Executable,
    bindparam,
    case,
    create_engine,
    event,
    exc,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Compiled, Connection, Dialect, Engine, Transaction
from sqlalchemy.types import TypeDecorator

from app.credits.pricing import MONEY_QUANTUM, to_money
from app.encoding import JSON_COLUMN_CODEC
from app.extensions import db
from app.observability import metrics
from app.process import process_id

log = logging.getLogger(__name__)

UNITS_PER_USD = int(1 / MONEY_QUANTUM)

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


def money_units(value: Decimal | int | None) -> int | None:
    """Return ``value`` USD as the count of MONEY_QUANTUM stored for it (rounded by to_money)."""
    if value is None:
        return None
    return int(to_money(Decimal(value)) * UNITS_PER_USD)


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
    return naive_utc(value).isoformat(" ", "microseconds")


def utcnow() -> datetime:
    """Return the current time, aware, in UTC."""
    return datetime.now(UTC)


# How long a statement on SQLite waits for another connection's write to end.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# The first and the longest pause between two tries at SQLite's write lock.
WRITE_LOCK_PAUSES = (0.0002, 0.005)


# A billed request changes about 20 pages over its two commits (bench/sqlite_pages.py
# counts them), and a commit writes each one whole to the WAL (copied into the kernel's
# cache and checksummed): pages of 1 KiB rather than SQLite's 4 KiB cost less system
# time per request, a few more of them though, and a generation's row still fits one
# page. Only a new database takes it: a file keeps its page size.
SQLITE_PAGE_SIZE = 1024
# The WAL a commit lets grow before it checkpoints it into the database: SQLite's 1,000
# pages, counted in bytes, so that smaller pages do not make checkpoints more frequent.
# A checkpoint syncs both files and stalls its worker meanwhile (about 10 ms here at
# this size, every 200 requests); a larger WAL saved no CPU measurably, but stalled longer.
SQLITE_WAL_BYTES_BEFORE_CHECKPOINT = 4 * 1024 * 1024


def sqlite_checkpoint_pages(page_size: int) -> int:
    """Return the WAL pages after which a commit checkpoints, for a database of ``page_size``."""
    return SQLITE_WAL_BYTES_BEFORE_CHECKPOINT // page_size


def sqlite_pragmas(page_size: int) -> list[str]:
    """Return the settings every SQLite connection gets, for a database of ``page_size``.

    WAL lets readers run beside the one writer; busy_timeout makes concurrent writers
    wait their turn instead of failing at once with "database is locked". In WAL mode
    synchronous=NORMAL skips the fsync of every commit (0.35 ms each, two a request): a
    commit survives the process dying, only a power loss can undo the last ones.
    """
    return [
        "journal_mode=WAL",
        "synchronous=NORMAL",
        f"wal_autocheckpoint={sqlite_checkpoint_pages(page_size)}",
        f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
        "foreign_keys=ON",
    ]


@event.listens_for(Engine, "connect")
def _configure_sqlite(dbapi_connection: Any, connection_record: Any) -> None:
    if type(dbapi_connection).__module__.startswith("sqlite3"):
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        page_size = cursor.execute("PRAGMA page_size").fetchone()[0]
        for pragma in sqlite_pragmas(page_size):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()


def wait_cooperatively(connection: Any) -> None:
    """Wait on a psycopg2 connection by yielding to gevent; the wait callback of a worker.

    Once a wait callback is set, psycopg2 connects asynchronously and libpq leaves
    ``connect_timeout`` to the caller, so it is enforced here: otherwise a database host
    that never answers holds the request until the OS gives up, minutes later.
    """
    import psycopg2
    from gevent.socket import wait_read, wait_write
    from psycopg2 import extensions

    deadline = None
    if connection.status == extensions.STATUS_SETUP:
        timeout = extensions.parse_dsn(connection.dsn).get("connect_timeout")
        deadline = time.monotonic() + float(timeout) if timeout else None
    expired = psycopg2.OperationalError("timeout expired while connecting to the database")
    while (state := connection.poll()) != extensions.POLL_OK:
        if state not in (extensions.POLL_READ, extensions.POLL_WRITE):
            raise psycopg2.OperationalError(f"unexpected state from poll(): {state}")
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise expired
        wait = wait_read if state == extensions.POLL_READ else wait_write
        wait(connection.fileno(), timeout=remaining, timeout_exc=expired)


def ping_idle_connections(engine: Engine, idle_seconds: float) -> None:
    """Check a pooled connection before use only if it sat unused for ``idle_seconds``.

    A connection lost while idle (a database restart, a firewall dropping quiet
    connections) is replaced before it fails a request, as ``pool_pre_ping`` would,
    without pre_ping's round trip on every checkout of a busy pool. A connection lost
    while in use fails its statement, and SQLAlchemy then replaces the whole pool.
    """

    @event.listens_for(engine, "checkin")
    def note_idle_since(dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def ping_if_idle(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < idle_seconds:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            # The pool discards the connection and checks out another.
            raise exc.DisconnectionError() from error


AUTOCOMMIT_ENGINE = "gateway.autocommit_engine"
KEPT_CONNECTIONS = "gateway.kept_connections"
SQLITE_WRITER = "gateway.sqlite_writer"
DURABLE_STATEMENTS = "gateway.durable_statements"


def init_database(app: Flask) -> None:
    """Bind the database; add the engine the hot path writes through.

    The hot path's statements on PostgreSQL are each complete on their own (a key's
    lookup, a hold, a covered settlement): run in autocommit they cost one round trip
    instead of three (BEGIN, the statement, COMMIT), and the rows they lock are free as
    soon as the statement ends, not when the worker gets round to its COMMIT, which is
    what every request waits on when they all pay from one account.
    """
    db.init_app(app)
    idle_seconds = app.config["DATABASE_IDLE_PING_SECONDS"]
    with app.app_context():
        # The session's engine serves no statement of a billed request on PostgreSQL
        # (they run alone, and again on a lost connection): its reads (the dashboard,
        # GET /v1/key) can afford a ping of every pooled connection before its use.
        ping_idle_connections(
            db.engine, 0 if db.engine.dialect.name == "postgresql" else idle_seconds
        )
        options = {**JSON_COLUMN_CODEC, **app.config["SQLALCHEMY_ENGINE_OPTIONS"]}
        alone = create_engine(db.engine.url, isolation_level="AUTOCOMMIT", **options)
        ping_idle_connections(alone, idle_seconds)
        app.extensions[KEPT_CONNECTIONS] = KeptConnections(alone, idle_seconds)
        if db.engine.dialect.name == "postgresql":
            app.extensions[AUTOCOMMIT_ENGINE] = alone
            app.extensions[DURABLE_STATEMENTS] = DurableStatements(
                functools.partial(execute_alone, prepared=True, again_if_lost=False)
            )
        elif db.engine.dialect.name == "sqlite":
            app.extensions[SQLITE_WRITER] = SQLiteWriter(sqlite_writer_engine(db.engine))


def sqlite_writer_engine(engine: Engine) -> Engine:
    """Return an engine of one connection to ``engine``'s database, for write_transaction.

    Its connection never waits for the write lock SQLite's way, which sleeps the whole
    process: write_transaction waits for it instead, yielding to the worker's other
    requests. Once BEGIN IMMEDIATE holds the lock, nothing in a WAL transaction waits
    for another connection again (its commit's checkpoint is a passive one), so the
    connection keeps a busy timeout of 0 throughout. One connection is enough:
    SQLiteWriter runs a process's writes on it in turn.
    """
    writer = create_engine(engine.url, pool_size=1, max_overflow=0, **JSON_COLUMN_CODEC)

    @event.listens_for(writer, "connect")
    def _fail_when_busy(dbapi_connection: Any, connection_record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=0")
        cursor.close()

    return writer


def runs_alone() -> bool:
    """Tell whether statements that write run alone (in autocommit): on PostgreSQL."""
    return AUTOCOMMIT_ENGINE in current_app.extensions


Written = TypeVar("Written")


def write_transaction(work: Callable[[Connection], Written]) -> Written:
    """Run ``work`` on a connection in a transaction of its own; return what it returns.

    The transaction is committed when ``work`` returns, and rolled back if it raises,
    its exception raised here. On SQLite it is one of the process's queued writes
    (SQLiteWriter), which may commit together with others: ``work`` must then only run
    statements on the connection it is given, never wait on anything else, and leave the
    connection's transaction to its caller (raise to undo what it did).
    """
    writer = current_app.extensions.get(SQLITE_WRITER)
    if writer is not None:
        return writer.run(work)
    try:
        return _transaction(work)
    except StatementsNotSent as lost:
        log.warning("%s; running the transaction again on another connection", lost)
    try:
        return _transaction(work)
    except StatementsNotSent as lost:
        raise lost.error from None


def failure_reason(error: exc.DBAPIError) -> str:
    """Say why a statement failed in one line, without its text or parameters."""
    lost = "the database connection was lost" if error.connection_invalidated else "it failed"
    first_line = str(error.orig).strip().splitlines()[0] if str(error.orig).strip() else ""
    return f"{lost}: {type(error.orig).__name__} {first_line}".rstrip()


class StatementsNotSent(Exception):
    """A transaction's connection was found lost before it committed: nothing was applied."""

    def __init__(self, error: exc.DBAPIError) -> None:
        super().__init__(failure_reason(error))
        self.error = error


def _transaction(work: Callable[[Connection], Written]) -> Written:
    """Run ``work`` in a transaction on a pooled connection; commit it.

    A connection the server closed while it sat in the pool fails the first statement
    sent on it, and the transaction with it: StatementsNotSent says so, so that the
    caller may run it again. A connection lost during the COMMIT is not one: the commit
    may have been applied.
    """
    with db.engine.connect() as connection:
        transaction = connection.begin()
        try:
            result = work(connection)
        except exc.DBAPIError as error:
            transaction.rollback()
            if error.connection_invalidated:
                raise StatementsNotSent(error) from error
            raise
        except BaseException:
            transaction.rollback()
            raise
        transaction.commit()
        return result


# The most writes a process commits together: each one queued makes the first wait longer.
GROUP_COMMIT_LIMIT = 16


@dataclass(eq=False)
class QueuedWrite:
    """A write waiting for its turn on a process's SQLite connection, then its outcome."""

    work: Callable[[Connection], Any]
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class SQLiteWriter:
    """A process's writes to SQLite, on its one connection, committed in groups.

    SQLite lets one connection write at a time, and most of a write's cost is its commit,
    which appends every page the transaction changed to the WAL: about twenty for a
    billed request's hold and settlement, the same account's and key's pages among them.
    Writes that queue while the process waits for the lock (another worker holds it) run
    one after the other in one transaction, each in a savepoint of its own so that one
    that fails undoes only itself, and commit once, each shared page written once
    (bench/sqlite_writes.py: 156 us of CPU a request committed alone, 77 in eights).

    Whichever queued request gets the turn runs the queue: the writes are plain
    functions, so the whole group runs and commits without yielding to the worker's
    other requests. Waiting for SQLite's lock is done by BEGIN IMMEDIATE, tried again
    with gevent's sleep, which yields (SQLite's own wait sleeps the whole process); once
    the lock is taken, nothing yields until the commit, so no other request of the
    process can ever find the lock held by its own process and sleep on it.
    """

    def __init__(self, engine: Engine, *, most_per_commit: int = GROUP_COMMIT_LIMIT) -> None:
        self.engine = engine
        self.most_per_commit = most_per_commit
        self._queue: deque[QueuedWrite] = deque()
        self._held: Connection | None = None
        self._held_by = process_id()
        # A gevent lock in a worker: gunicorn's configuration patches threading first.
        self._turn = threading.Lock()

    def run(self, work: Callable[[Connection], Written]) -> Written:
        """Queue ``work``; run the queue when this request's turn comes; return its result."""
        write = QueuedWrite(work)
        self._queue.append(write)
        try:
            with self._turn:
                while not write.done:
                    self._run_queued()
        finally:
            if not write.done:  # given up while queued (the request was killed)
                self._queue.remove(write)
        if write.error is not None:
            raise write.error
        return write.result

    def _run_queued(self) -> None:
        """Take the write lock, run the writes queued by then in one transaction, commit."""
        connection = self._connection()
        transaction = connection.begin()
        try:
            self._lock_and_run(transaction, connection)
        finally:
            if transaction.is_active:  # the lock was not taken, or a write was interrupted
                transaction.rollback()

    def _lock_and_run(self, transaction: Transaction, connection: Connection) -> None:
        try:
            _take_write_lock(connection)
        except exc.DBAPIError as error:
            # Every write queued now waited for the lock as long.
            self._finish(self._next_group(), error)
            return
        group = self._next_group()
        if len(group) > 1:
            metrics.sqlite_shared_commit_writes.observe(len(group))
        outcome: BaseException | None = RuntimeError("the write's transaction was interrupted")
        try:
            self._run_group(transaction, connection, group)
            outcome = None
        except Exception as error:  # the commit failed: every write with it
            outcome = error
        finally:
            self._finish(group, outcome)

    def _connection(self) -> Connection:
        """Return the process's connection for its writes, opened on first use.

        It stays checked out: checking a connection out of the pool and in again cost
        each write more than its statements (about 110K instructions). A forked child
        leaves its parent's connection alone and opens its own.
        """
        held = self._held
        if self._held_by != process_id():
            self.engine.dispose(close=False)
            held = None
        if held is None or held.invalidated or held.closed:
            held = self._held = self.engine.connect()
            self._held_by = process_id()
        return held

    def _next_group(self) -> list[QueuedWrite]:
        count = min(len(self._queue), self.most_per_commit)
        return [self._queue.popleft() for _ in range(count)]

    @staticmethod
    def _run_group(
        transaction: Transaction, connection: Connection, group: list[QueuedWrite]
    ) -> None:
        if len(group) == 1:
            _run_write(connection, group[0])
            if group[0].error is None:
                transaction.commit()
            else:
                transaction.rollback()
            return
        for write in group:
            _on_driver(connection, "SAVEPOINT queued_write").close()
            _run_write(connection, write)
            if write.error is not None:
                _on_driver(connection, "ROLLBACK TO queued_write").close()
            _on_driver(connection, "RELEASE queued_write").close()
        transaction.commit()

    @staticmethod
    def _finish(group: list[QueuedWrite], error: BaseException | None) -> None:
        """Mark ``group`` done; ``error`` (a failed lock or commit) is each write's outcome."""
        for write in group:
            write.done = True
            if error is not None and write.error is None:
                write.result, write.error = None, error


def _run_write(connection: Connection, write: QueuedWrite) -> None:
    try:
        write.result = write.work(connection)
    except Exception as error:
        write.error = error


def _take_write_lock(connection: Connection) -> None:
    pause, longest = WRITE_LOCK_PAUSES
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    # Each try is the driver's alone: a try that finds the lock taken is the common
    # case under load, too common to pay for SQLAlchemy's exception around it.
    dbapi = connection.dialect.loaded_dbapi
    cursor = connection.connection.dbapi_connection.cursor()
    try:
        while True:
            try:
                cursor.execute("BEGIN IMMEDIATE")
                return
            except dbapi.OperationalError as error:
                if "database is locked" not in str(error) or time.monotonic() > deadline:
                    raise exc.DBAPIError.instance(
                        "BEGIN IMMEDIATE", None, error, dbapi.Error, dialect=connection.dialect
                    ) from error
            # gevent's sleep in a worker: the other requests run meanwhile.
            time.sleep(pause)
            pause = min(pause * 2, longest)
    finally:
        cursor.close()


def execute_alone(
    statement: Executable,
    parameters: dict[str, Any],
    *,
    prepared: bool = False,
    again_if_lost: bool = True,
) -> Sequence[Any]:
    """Run one statement on a connection of its own, in autocommit; return its rows.

    The connection is kept by the process for the next such statement (KeptConnections),
    free for it as soon as this returns. Nothing can roll the statement back, so it must
    be all-or-nothing by itself; on SQLite it must write nothing, since writes wait
    their turn through write_transaction. ``prepared``, it is planned once per
    connection on PostgreSQL.

    A statement whose connection is found lost (the server closed it while it sat
    unused) runs once more on another, every kept connection given up with it: a read,
    or a hold whose first try, if it was applied after all, is a hold nobody settles,
    released when it expires. ``again_if_lost=False`` leaves that to the caller, for a
    statement that must know whether it was applied (a settlement).
    """
    kept = current_app.extensions[KEPT_CONNECTIONS]
    if not again_if_lost:
        return kept.run(statement, parameters, prepared=prepared)
    try:
        return kept.run(statement, parameters, prepared=prepared)
    except exc.DBAPIError as error:
        if not error.connection_invalidated:
            raise
        log.warning("%s; running the statement again", failure_reason(error))
    return kept.run(statement, parameters, prepared=prepared)


class KeptConnections:
    """The connections of statements run alone, kept by the process between statements.

    Checking a connection out of SQLAlchemy's pool and in again costs about 120K
    instructions under gevent (its queue's locks are pure Python there), more than the
    statement's own work. The process keeps the connections its statements used and
    takes the most recent first. One goes back to the pool when the pool has none left
    to give (another statement may be waiting for one there), when its statement failed
    (a lost one sends back every kept one: the server went away), and, if it sat unused
    longer than the idle ping's time, it is pinged first, as the pool's checkout would.

    Its engine's pool has no other client, so the connections checked out of it are
    the ones counted here: asking the pool would take its queue's lock again.
    """

    def __init__(self, engine: Engine, idle_seconds: float) -> None:
        self.engine = engine
        self.idle_seconds = idle_seconds
        self._kept: list[tuple[Connection, float]] = []
        self._checked_out = 0
        self._pid = process_id()

    def run(
        self, statement: Executable, parameters: dict[str, Any], *, prepared: bool
    ) -> Sequence[Any]:
        """Run ``statement`` in autocommit on a kept connection; return its rows."""
        connection = self.take()
        try:
            if prepared and connection.dialect.name == "postgresql":
                rows = execute_prepared(connection, statement, parameters)
            else:
                rows = fetch_on_driver(connection, statement, parameters)
        except BaseException:
            self.discard(connection)
            raise
        self.keep(connection)
        return rows

    def take(self) -> Connection:
        """Return a kept connection that is still good, else one from the pool."""
        if self._pid != process_id():
            # A forked child: its parent's connections are not its own.
            self._pid, self._kept, self._checked_out = process_id(), [], 0
            self.engine.dispose(close=False)
        while self._kept:
            connection, kept_since = self._kept.pop()
            if time.monotonic() - kept_since < self.idle_seconds or self._answers(connection):
                return connection
        connection = self.engine.connect()
        self._checked_out += 1
        return connection

    def keep(self, connection: Connection) -> None:
        """Keep ``connection`` for the next statement, or give it back if someone may wait."""
        if connection.invalidated or self._checked_out >= self.engine.pool.size():
            self._give_back(connection)
        else:
            self._kept.append((connection, time.monotonic()))

    def discard(self, connection: Connection) -> None:
        """Give back the connection of a failed statement; if it was lost, every kept one."""
        if connection.invalidated:
            kept, self._kept = self._kept, []
            for other, _ in kept:
                other.invalidate()
                self._give_back(other)
        self._give_back(connection)

    def _give_back(self, connection: Connection) -> None:
        connection.close()
        self._checked_out -= 1

    def _answers(self, connection: Connection) -> bool:
        try:
            self.engine.dialect.do_ping(connection.connection.dbapi_connection)
        except self.engine.dialect.loaded_dbapi.Error as error:
            connection.invalidate(error)
            self._give_back(connection)
            return False
        return True


# Selected by a statement run alone on PostgreSQL, these say how its transaction (the
# statement) commits; local to it, so the connection's next statement commits as
# configured. COMMIT_AS_CHOSEN, for the statements of execute_durably: waiting for the
# disk as the server is configured to (commit_waits), or not at all.
_SYNCHRONOUS_COMMIT = literal_column("'synchronous_commit'")
_NOT_WAITING = literal_column("'off'")
COMMIT_WITHOUT_WAITING = func.set_config(_SYNCHRONOUS_COMMIT, _NOT_WAITING, true())
COMMIT_AS_CHOSEN = func.set_config(
    _SYNCHRONOUS_COMMIT,
    case(
        (
            bindparam("commit_waits", type_=Boolean()),
            func.current_setting(_SYNCHRONOUS_COMMIT),
        ),
        else_=_NOT_WAITING,
    ),
    true(),
)
# Commits as the server is configured to: txid_current() gives its transaction the id
# that makes it write a commit record, which it waits for the WAL to hold on disk, and
# the WAL up to it with it.
_FLUSH_WAL = select(func.txid_current())


class DurableStatements:
    """Statements run alone on PostgreSQL that are on disk when they return, without a convoy.

    A settlement updates its account's row, as every request paying from the account
    does. Committed synchronously, it keeps that row locked while PostgreSQL writes the
    WAL to disk, so under load the account's requests take their turns one disk write
    after another: at c=64, 70% of the floor's requests a second, against 79% with no
    request waiting for the disk at all (bench/RESULTS.md).

    Alone in the process, a statement commits as the server is configured to: one round
    trip. Beside another, it commits without waiting, which frees its rows at once, and
    waits instead for a flush of the WAL sent after it ended (_FLUSH_WAL), whose commit
    puts the WAL on disk up to its own commit record, past every commit before it. The
    statements waiting at once share one: whoever finds none on its way sends the next.
    So it returns, as a synchronous commit would, only once what it wrote is on disk.
    The choice is made on a count the process keeps without a lock: a wrong guess only
    costs a round trip or a turn in line.
    """

    def __init__(self, run: Callable[[Executable, dict[str, Any]], Sequence[Any]]) -> None:
        self.run = run
        self._running = 0
        self._flushes_sent = 0
        self._flushes_done = 0
        self._flushing = False
        self._failed: tuple[int, Exception] | None = None
        # A gevent condition in a worker: gunicorn's configuration patches threading first.
        self._flushed = threading.Condition()

    def execute(self, statement: Executable, parameters: dict[str, Any]) -> Sequence[Any]:
        """Run ``statement`` (which selects COMMIT_AS_CHOSEN); return its rows once on disk."""
        alone = self._running == 0
        self._running += 1
        try:
            rows = self.run(statement, {**parameters, "commit_waits": alone})
        finally:
            self._running -= 1
        if not alone:
            self._wait_for_flush()
        return rows

    def _wait_for_flush(self) -> None:
        """Return once a flush sent after this call is done; raise if that flush failed."""
        with self._flushed:
            needed = self._flushes_sent + 1
            while self._flushes_done < needed:
                if self._failed is not None and self._failed[0] >= needed:
                    raise self._failed[1]
                if self._flushing:
                    self._flushed.wait()
                else:
                    self._flush()

    def _flush(self) -> None:
        """Send the next flush, without holding the condition meanwhile."""
        self._flushing = True
        self._flushes_sent += 1
        number = self._flushes_sent
        self._flushed.release()
        try:
            self.run(_FLUSH_WAL, {})
        except Exception as error:
            # The waiters' outcome too. A sender that was killed (its request timed out)
            # says nothing of the server: one of them sends the flush again.
            self._failed = (number, error)
            raise
        else:
            self._flushes_done = number
        finally:
            self._flushed.acquire()
            self._flushing = False
            self._flushed.notify_all()


def execute_durably(statement: Executable, parameters: dict[str, Any]) -> Sequence[Any]:
    """Run ``statement`` alone and prepared on PostgreSQL; return its rows once on disk.

    It must select COMMIT_AS_CHOSEN, and be all-or-nothing by itself (execute_alone).
    """
    return current_app.extensions[DURABLE_STATEMENTS].execute(statement, parameters)


@dataclass(frozen=True)
class DriverForm:
    """A statement as its driver takes it: its text, and how its parameters are sent."""

    text: str
    compiled: Compiled
    # Whether the driver takes the parameters in the order of the text's placeholders
    # (``names``), or by name.
    positional: bool
    # What turns a parameter's value into what the driver sends (money into units...).
    processors: dict[str, Callable[[Any], Any]]
    # Whether SQLAlchemy computes some values when it executes the statement (the
    # Python-side defaults of columns an INSERT leaves out): such a statement is left to
    # SQLAlchemy's execution, since only it fills them in.
    computes_defaults: bool
    # The name it is prepared under, for forms compiled for PREPARE.
    name: str
    # What turns each column the driver reads into its Python value (None: as read),
    # and the rows' type, whose fields are named like the statement's columns; no type
    # for a textual statement, which names no columns: its rows are returned as read.
    result_processors: tuple[Callable[[Any], Any] | None, ...]
    row_type: type[tuple] | None
    # The placeholders' names in the text (in their order when positional) and, per
    # name: the parameter key it takes, whether a value is required, the value the
    # statement itself carries, its processor. None when some parameter is not a plain
    # value (an expanding IN, a callable): construct_params works them out every time.
    names: tuple[str, ...]
    slots: tuple[tuple[str, str, bool, Any, Callable[[Any], Any] | None], ...] | None

    def arguments(self, parameters: dict[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        """Return what the driver is sent for ``parameters``."""
        if self.slots is None:
            values = self.compiled.construct_params(parameters)
            processors = self.processors
            if not self.positional:
                return {
                    key: processors[key](value) if key in processors else value
                    for key, value in values.items()
                }
            return tuple(
                processors[key](values[key]) if key in processors else values[key]
                for key in self.names
            )
        sent = []
        for name, key, required, constant, processor in self.slots:
            # Looked up as SQLAlchemy's construct_params does: by the parameter's key,
            # then by its name in the text, else the value the statement carries.
            if key in parameters:
                value = parameters[key]
            elif name in parameters:
                value = parameters[name]
            elif required:
                raise exc.InvalidRequestError(f"A value is required for bind parameter {key!r}")
            else:
                value = constant
            sent.append(value if processor is None else processor(value))
        if not self.positional:
            return dict(zip(self.names, sent, strict=True))
        return tuple(sent)

    def rows(self, cursor: Any) -> list[tuple]:
        """Read ``cursor``'s rows and close it; values typed as SQLAlchemy types them."""
        read = cursor.fetchall()
        cursor.close()
        if self.row_type is None:
            return list(read)
        processors = self.result_processors
        return [
            self.row_type(*(p(v) if p else v for p, v in zip(processors, row, strict=True)))
            for row in read
        ]


# Writes the numbered parameters PREPARE takes, each cast to its type.
_NUMBERED_PARAMETERS = postgresql.asyncpg.dialect()


@functools.lru_cache(maxsize=256)
def driver_form(
    statement: Executable,
    dialect: Dialect,
    keys: tuple[str, ...] | None = None,
    *,
    for_prepare: bool = False,
) -> DriverForm:
    """Compile ``statement`` once, its values to be sent by ``dialect``'s driver.

    ``keys`` are the parameters it is executed with, which decide the columns of an
    INSERT. ``for_prepare`` compiles it with PostgreSQL's numbered parameters instead:
    psycopg2 sends statements as text, which PostgreSQL plans afresh every time, and
    the hold's statement takes longer to plan than to run.
    """
    column_keys = None if keys is None else list(keys)
    compiled = statement.compile(
        dialect=_NUMBERED_PARAMETERS if for_prepare else dialect, column_keys=column_keys
    )
    # As SQLAlchemy's own execution does: each type as the dialect implements it.
    processors = {}
    for key, parameter in compiled.binds.items():
        if (processor := parameter.type.dialect_impl(dialect).bind_processor(dialect)) is not None:
            processors[key] = processor
    columns = getattr(statement, "selected_columns", None)
    text = compiled.string
    names, slots = _parameter_slots(compiled, processors)
    return DriverForm(
        text=text,
        compiled=compiled,
        positional=compiled.positional,
        processors=processors,
        computes_defaults=bool(compiled.insert_prefetch or compiled.update_prefetch),
        name="gateway_" + hashlib.sha256(text.encode()).hexdigest()[:24],
        result_processors=tuple(
            column.type.dialect_impl(dialect).result_processor(dialect, None)
            for column in (columns or ())
        ),
        row_type=None if columns is None else namedtuple("Row", columns.keys(), rename=True),
        names=names,
        slots=slots,
    )


def _parameter_slots(
    compiled: Compiled, processors: dict[str, Callable[[Any], Any]]
) -> tuple[tuple[str, ...], tuple | None]:
    """Return the placeholders' names in the text and their slots (see DriverForm)."""
    binds = {name: bind for bind, name in compiled.bind_names.items()}
    names = tuple(compiled.positiontup) if compiled.positional else tuple(binds)
    plain = not compiled.escaped_bind_names and all(
        name in binds
        and binds[name].callable is None
        and not binds[name].expanding
        and not binds[name].literal_execute
        for name in names
    )
    if not plain:
        return names, None
    slots = tuple(
        (name, binds[name].key, binds[name].required, binds[name].value, processors.get(name))
        for name in names
    )
    return names, slots


def execute_on_driver(
    connection: Connection, statement: Executable, parameters: dict[str, Any]
) -> int:
    """Execute a write whose rows are not wanted on the driver directly; return its count.

    The hot path's statements are compiled once and handed to the driver: SQLAlchemy's
    own execution of an already compiled statement (its cache lookup, execution context
    and result) costs more than the driver's work on SQLite. ``connection`` keeps its
    transaction: the statement runs within it.
    """
    form = driver_form(statement, connection.dialect, tuple(parameters))
    if form.computes_defaults:
        return connection.execute(statement, parameters).rowcount
    cursor = _on_driver(connection, form.text, form.arguments(parameters))
    count = cursor.rowcount
    cursor.close()
    return count


def fetch_on_driver(
    connection: Connection, statement: Executable, parameters: dict[str, Any]
) -> Sequence[Any]:
    """Execute a statement on the driver directly; return its rows, typed."""
    form = driver_form(statement, connection.dialect, tuple(parameters))
    if form.computes_defaults:
        return connection.execute(statement, parameters).all()
    return form.rows(_on_driver(connection, form.text, form.arguments(parameters)))


def _on_driver(connection: Connection, text: str, arguments: Any = None) -> Any:
    """Execute ``text`` on a cursor of ``connection``'s driver; return the cursor.

    A failure is raised as SQLAlchemy raises it (an IntegrityError is one), the
    connection invalidated if it was lost, and the pool's older connections with it.
    """
    dialect = connection.dialect
    dbapi_connection = connection.connection.dbapi_connection
    cursor = dbapi_connection.cursor()
    try:
        if arguments is None:
            cursor.execute(text)
        else:
            cursor.execute(text, arguments)
    except dialect.loaded_dbapi.Error as error:
        lost = dialect.is_disconnect(error, dbapi_connection, cursor)
        if lost:
            # As SQLAlchemy's own execution does on a disconnect: the pool's connections
            # opened before this one are replaced when next checked out, since what lost
            # one (a server restart, pg_terminate_backend) ends the idle ones too; a
            # statement run again must not meet another.
            connection.engine.pool._invalidate(connection.connection, error)
            connection.invalidate(error)
        raise exc.DBAPIError.instance(
            text, arguments, error, dialect.loaded_dbapi.Error,
            connection_invalidated=lost, dialect=dialect,
        ) from error  # fmt: skip
    return cursor


# SQLSTATE of EXECUTE naming a statement the server session does not have.
UNKNOWN_PREPARED_STATEMENT = "26000"
PREPARED_STATEMENTS_LOST = "gateway.prepared_statements_lost"


def execute_prepared(
    connection: Connection, statement: Executable, parameters: dict[str, Any]
) -> Sequence[Any]:
    """Execute ``statement`` as a prepared statement of ``connection``; return its rows.

    A pooler between the gateway and PostgreSQL (PgBouncer in transaction mode) may run
    the EXECUTE on another server session than the PREPARE: the statement then runs
    unprepared, and the app stops preparing.
    """
    form = driver_form(statement, connection.dialect, for_prepare=True)
    if current_app.extensions.get(PREPARED_STATEMENTS_LOST) or form.computes_defaults:
        return fetch_on_driver(connection, statement, parameters)
    prepared = connection.connection.info.setdefault("prepared", set())
    if form.name not in prepared:
        _on_driver(connection, f"PREPARE {form.name} AS {form.text}").close()
        prepared.add(form.name)
    arguments = form.arguments(parameters)
    placeholders = f"({', '.join(['%s'] * len(arguments))})" if arguments else ""
    try:
        cursor = _on_driver(connection, f"EXECUTE {form.name}{placeholders}", arguments)
    except exc.DBAPIError as error:
        if getattr(error.orig, "pgcode", None) != UNKNOWN_PREPARED_STATEMENT:
            raise
        log.warning("prepared statements do not last on this database's sessions: not preparing")
        current_app.extensions[PREPARED_STATEMENTS_LOST] = True
        return fetch_on_driver(connection, statement, parameters)
    return form.rows(cursor)
