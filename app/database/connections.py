"""The three doors every write goes through, and the connections behind them.

- ``write_transaction``: statements in a transaction of their own (on SQLite, one of the
  process's queued writes, committed with others);
- ``execute_alone``: one all-or-nothing statement in autocommit, on a connection the
  process keeps (on PostgreSQL, prepared);
- ``execute_durably``: such a statement that is on disk when it returns (PostgreSQL).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from flask import Flask, current_app
from sqlalchemy import (
    Executable,
    create_engine,
    event,
    exc,
    select,
    text,
)
from sqlalchemy.engine import Connection, Engine

from app.database.driver import (
    PREPARED_STATEMENTS_LOST,
    execute_prepared,
    fetch_on_driver,
    keeps_its_session,
    stop_preparing,
)
from app.database.postgresql import COMMIT_WITHOUT_WAITING, DurableStatements
from app.database.sqlite import SQLiteWriter, sqlite_writer_engine
from app.encoding import JSON_COLUMN_CODEC
from app.extensions import db
from app.process import process_id

log = logging.getLogger(__name__)


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
        if db.engine.dialect.name == "postgresql":
            prepare_only_on_kept_sessions(app, db.engine)
        options = {**JSON_COLUMN_CODEC, **app.config["SQLALCHEMY_ENGINE_OPTIONS"]}
        alone = create_engine(db.engine.url, isolation_level="AUTOCOMMIT", **options)
        ping_idle_connections(alone, idle_seconds)
        app.extensions[KEPT_CONNECTIONS] = KeptConnections(alone, idle_seconds)
        if db.engine.dialect.name == "postgresql":
            prepare_only_on_kept_sessions(app, alone)
            app.extensions[AUTOCOMMIT_ENGINE] = alone
            app.extensions[DURABLE_STATEMENTS] = DurableStatements(
                functools.partial(execute_alone, prepared=True, again_if_lost=False)
            )
        elif db.engine.dialect.name == "sqlite":
            app.extensions[SQLITE_WRITER] = SQLiteWriter(sqlite_writer_engine(db.engine))


def prepare_only_on_kept_sessions(app: Flask, engine: Engine) -> None:
    """Have ``engine``'s new connections prepare nothing once one is found pooled.

    psycopg prepares a statement run five times on a connection, and the app's hot
    statements the first time (execute_alone's); a pooler that moves a connection
    between server sessions is found by each new connection's first round trip.
    """

    @event.listens_for(engine, "connect")
    def check_its_session(dbapi_connection: Any, record: Any) -> None:
        lost = app.extensions.get(PREPARED_STATEMENTS_LOST)
        if not lost and not keeps_its_session(dbapi_connection):
            stop_preparing(app, "a pooler moves this database's connections between sessions")
            lost = True
        if lost:
            dbapi_connection.prepare_threshold = None


def runs_alone() -> bool:
    """Tell whether statements that write run alone (in autocommit): on PostgreSQL."""
    return AUTOCOMMIT_ENGINE in current_app.extensions


Written = TypeVar("Written")


def write_transaction(
    work: Callable[[Connection], Written],
    *,
    alone: Callable[[], Written | None] | None = None,
    durable_after_unlock: bool = False,
) -> Written:
    """Run ``work`` on a connection in a transaction of its own; return what it returns.

    The transaction is committed when ``work`` returns, and rolled back if it raises,
    its exception raised here. On SQLite it is one of the process's queued writes
    (SQLiteWriter), which may commit together with others: ``work`` must then only run
    statements on the connection it is given, never wait on anything else, and leave the
    connection's transaction to its caller (raise to undo what it did).

    ``alone`` is the same write as one all-or-nothing statement (run by execute_alone
    or execute_durably): where statements run alone (PostgreSQL), it runs instead of
    ``work``, one round trip whose rows are locked only while it runs. It may decline,
    for a case only ``work`` handles, by returning None: ``work`` then runs.

    ``durable_after_unlock``, for a transaction that locks rows every request shares (an
    account's): on PostgreSQL it commits without waiting for the disk, so that its locks
    are released at once rather than after a WAL flush, and returns only once a shared
    flush sent after its commit is done (DurableStatements.wait_for_disk): as durable when
    it returns as a synchronous commit, without the account's other requests queueing
    behind its disk write.
    """
    # The app's extensions are read once: every use of the current_app proxy looks the
    # app's context up again, which costs more than the rest of this function.
    extensions = current_app._get_current_object().extensions
    writer = extensions.get(SQLITE_WRITER)
    if writer is not None:
        # SQLite's writes are all queued: none runs alone there (runs_alone).
        return writer.run(work)
    if alone is not None and runs_alone() and (done := alone()) is not None:
        return done
    durable = extensions.get(DURABLE_STATEMENTS) if durable_after_unlock else None
    if durable is not None:
        work = _committing_without_waiting(work)
    try:
        done = _transaction(work)
    except StatementsNotSent as lost:
        log.warning("%s; running the transaction again on another connection", lost)
        try:
            done = _transaction(work)
        except StatementsNotSent as lost_again:
            raise lost_again.error from None
    if durable is not None:
        durable.wait_for_disk()
    return done


_NOT_WAITING_FOR_DISK = select(COMMIT_WITHOUT_WAITING)


def _committing_without_waiting(
    work: Callable[[Connection], Written],
) -> Callable[[Connection], Written]:
    """Return ``work`` preceded by PostgreSQL's SET LOCAL synchronous_commit = off."""

    def without_waiting(connection: Connection) -> Written:
        connection.execute(_NOT_WAITING_FOR_DISK)
        return work(connection)

    return without_waiting


_ADVISORY_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(:name, 0))")


def lock_until_commit(connection: Connection, name: str) -> None:
    """Hold a lock named ``name`` until ``connection``'s transaction ends.

    For a rule no unique index can keep (a partitioned table's unique keys must include
    its partition key): transactions that take the same name run one after the other.
    PostgreSQL takes an advisory lock; SQLite's write transactions run one at a time.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(_ADVISORY_LOCK, {"name": name})


# PostgreSQL's code for a transaction it ended to break a deadlock.
DEADLOCK_DETECTED = "40P01"


def again_after_deadlock(change: Callable[[], Written], *, tries: int = 3) -> Written:
    """Run ``change``, a transaction on the session that commits; again if ended by a deadlock.

    Two transactions that take the same rows in opposite orders can wait on each other;
    PostgreSQL ends one of them, which has then applied nothing. A change made seldom
    (an operator's or admin's) that takes rows in another order than the requests do
    runs again once the other transaction has its rows, rather than failing its caller.
    """
    for _ in range(tries - 1):
        try:
            return change()
        except exc.OperationalError as error:
            db.session.rollback()
            if getattr(error.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                raise
            log.warning("%s; running the transaction again", failure_reason(error))
    return change()


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
    or a hold, whose second try meets the first one's row if that was applied after all
    (place_hold then takes it as its own). ``again_if_lost=False`` leaves that to the
    caller, for a statement that must know whether it was applied (a settlement).
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


def execute_durably(statement: Executable, parameters: dict[str, Any]) -> Sequence[Any]:
    """Run ``statement`` alone and prepared on PostgreSQL; return its rows once on disk.

    It must select COMMIT_AS_CHOSEN, and be all-or-nothing by itself (execute_alone).
    """
    return current_app.extensions[DURABLE_STATEMENTS].execute(statement, parameters)
