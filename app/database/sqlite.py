"""SQLite: the settings of every connection, and the one writer each process writes through.

SQLite lets one connection write at a time. A process's writes queue for its one
writing connection (SQLiteWriter) and commit in groups; waiting for the lock yields to
the worker's other requests instead of sleeping the whole process.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import (
    create_engine,
    event,
    exc,
)
from sqlalchemy.engine import Connection, Engine, Transaction

from app.database.driver import driver_cursor
from app.encoding import JSON_COLUMN_CODEC
from app.observability import metrics
from app.process import process_id

Written = TypeVar("Written")

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


def sha256_hex_of(text: str | None) -> str | None:
    """Return the SHA-256 of ``text``'s UTF-8 bytes in hex: PostgreSQL's, as SQLite's sha256_hex."""
    if text is None:
        return None
    return hashlib.sha256(text.encode()).hexdigest()


@event.listens_for(Engine, "connect")
def _configure_sqlite(dbapi_connection: Any, connection_record: Any) -> None:
    if type(dbapi_connection).__module__.startswith("sqlite3"):
        # The ledger's chain (app.credits.chain) is hashed in SQL, on either database.
        dbapi_connection.create_function("sha256_hex", 1, sha256_hex_of, deterministic=True)
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        page_size = cursor.execute("PRAGMA page_size").fetchone()[0]
        for pragma in sqlite_pragmas(page_size):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()


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
            driver_cursor(connection, "SAVEPOINT queued_write").close()
            _run_write(connection, write)
            if write.error is not None:
                driver_cursor(connection, "ROLLBACK TO queued_write").close()
            driver_cursor(connection, "RELEASE queued_write").close()
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
