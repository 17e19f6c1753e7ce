"""Statements handed to the driver directly: compiled once, their parameters bound in one step.

The hot path's statements are compiled once and handed to the driver: SQLAlchemy's own
execution of an already compiled statement (its cache lookup, execution context and
result) costs more than the driver's work. On PostgreSQL they are written with the
server's own numbered parameters and sent through psycopg's RawCursor, bound in the
extended protocol (never rendered into the text), and may be prepared once per
connection.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flask import Flask, current_app
from psycopg import RawCursor
from psycopg.types.numeric import Int8
from sqlalchemy import (
    Executable,
    Integer,
    exc,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Compiled, Connection, Dialect
from sqlalchemy.types import TypeEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverForm:
    """A statement as its driver takes it: its text, and how its parameters are sent."""

    text: str
    compiled: Compiled
    # Whether the driver takes the parameters in the order of the text's parameter markers
    # (``names``), or by name.
    positional: bool
    # What turns a parameter's value into what the driver sends (money into units...).
    processors: dict[str, Callable[[Any], Any]]
    # Whether SQLAlchemy computes some values when it executes the statement (the
    # Python-side defaults of columns an INSERT leaves out): such a statement is left to
    # SQLAlchemy's execution, since only it fills them in.
    computes_defaults: bool
    # What turns each column the driver reads into its Python value (None: as read),
    # and the rows' type, whose fields are named like the statement's columns; no type
    # for a textual statement, which names no columns: its rows are returned as read.
    result_processors: tuple[Callable[[Any], Any] | None, ...]
    row_type: type[tuple] | None
    # The parameter markers' names in the text (in their order when positional) and, per
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


# Writes PostgreSQL's numbered parameters ($1), each cast to its type: psycopg's RawCursor
# sends them as they are, where its default cursor scans the whole text for its own
# markers on every call (the hold's and settlement's texts are long).
_NUMBERED_PARAMETERS = postgresql.asyncpg.dialect()


@functools.lru_cache(maxsize=4)
def _named_parameters(dialect: Dialect) -> Dialect:
    """Return ``dialect`` writing named parameters (``:name``) instead of positional ones.

    A positional marker (SQLite's ``?``) is bound once per appearance in the text: a
    value the statement uses in several places (a budget window's start, the amount)
    would be sent and bound as many times. A named one is bound once, wherever it appears.
    """
    named = copy.copy(dialect)
    named.paramstyle, named.positional = "named", False
    return named


def _compiling_dialect(dialect: Dialect) -> Dialect:
    """Return the dialect a statement for ``dialect``'s driver is compiled with."""
    if dialect.name == "postgresql":
        return _NUMBERED_PARAMETERS
    if dialect.paramstyle == "qmark":
        return _named_parameters(dialect)
    return dialect


def _as_int8(value: int | None) -> Int8 | None:
    return None if value is None else Int8(value)


def _bind_processor(bind_type: TypeEngine, dialect: Dialect) -> Callable[[Any], Any] | None:
    """Return what turns a parameter of ``bind_type`` into what ``dialect``'s driver sends.

    As SQLAlchemy's own execution does: the type as the dialect implements it. On
    PostgreSQL an integer is sent as a bigint (the text casts it to its column's type):
    psycopg would send each as the smallest type its value fits, and a prepared
    statement is kept per types sent, so one statement would be prepared again and
    again as its amounts grow.
    """
    implementation = bind_type.dialect_impl(dialect)
    processor = implementation.bind_processor(dialect)
    integer = isinstance(getattr(implementation, "impl_instance", implementation), Integer)
    if dialect.name != "postgresql" or not integer:
        return processor
    if processor is None:
        return _as_int8
    return lambda value: _as_int8(processor(value))


@functools.lru_cache(maxsize=256)
def driver_form(
    statement: Executable, dialect: Dialect, keys: tuple[str, ...] | None = None
) -> DriverForm:
    """Compile ``statement`` once, its values to be sent by ``dialect``'s driver.

    ``keys`` are the parameters it is executed with, which decide the columns of an
    INSERT.
    """
    column_keys = None if keys is None else list(keys)
    compiled = statement.compile(dialect=_compiling_dialect(dialect), column_keys=column_keys)
    processors = {}
    for key, parameter in compiled.binds.items():
        if (processor := _bind_processor(parameter.type, dialect)) is not None:
            processors[key] = processor
    columns = getattr(statement, "selected_columns", None)
    names, slots = _parameter_slots(compiled, processors)
    return DriverForm(
        text=compiled.string,
        compiled=compiled,
        positional=compiled.positional,
        processors=processors,
        computes_defaults=bool(compiled.insert_prefetch or compiled.update_prefetch),
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
    """Return the parameter markers' names in the text and their slots (see DriverForm)."""
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
    cursor = driver_cursor(connection, form.text, form.arguments(parameters))
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
    return form.rows(driver_cursor(connection, form.text, form.arguments(parameters)))


def driver_cursor(
    connection: Connection, text: str, arguments: Any = None, *, prepare: bool | None = None
) -> Any:
    """Execute ``text`` on a cursor of ``connection``'s driver; return the cursor.

    On PostgreSQL ``prepare`` has it prepared on the connection's server session the
    first time, and executed by name from then on (psycopg keeps the names, by text);
    None leaves it to psycopg, which prepares a statement run five times.
    A failure is raised as SQLAlchemy raises it (an IntegrityError is one), the
    connection invalidated if it was lost, and the pool's idle connections with it.
    """
    dialect = connection.dialect
    dbapi_connection = connection.connection.dbapi_connection
    postgresql = dialect.name == "postgresql"
    cursor = RawCursor(dbapi_connection) if postgresql else dbapi_connection.cursor()
    try:
        if postgresql:
            cursor.execute(text, arguments, prepare=prepare)
        elif arguments is None:
            cursor.execute(text)
        else:
            cursor.execute(text, arguments)
    except dialect.loaded_dbapi.Error as error:
        lost = dialect.is_disconnect(error, dbapi_connection, cursor)
        if lost:
            connection.invalidate(error)
            # What lost this one (a server restart, pg_terminate_backend) ended the idle
            # ones too: the pool starts afresh, its idle connections closed, so that a
            # statement run again does not meet another. Connections out of the pool
            # (kept by other statements) are left to fail and be replaced in turn.
            connection.engine.dispose()
        raise exc.DBAPIError.instance(
            text, arguments, error, dialect.loaded_dbapi.Error,
            connection_invalidated=lost, dialect=dialect,
        ) from error  # fmt: skip
    return cursor


# SQLSTATE of a statement executed by a name the server session does not know.
UNKNOWN_PREPARED_STATEMENT = "26000"
PREPARED_STATEMENTS_LOST = "gateway.prepared_statements_lost"


def execute_prepared(
    connection: Connection, statement: Executable, parameters: dict[str, Any]
) -> Sequence[Any]:
    """Execute ``statement`` as a prepared statement of ``connection``; return its rows.

    A pooler between the gateway and PostgreSQL (PgBouncer in transaction mode) may run
    the statement on another server session than the one it was prepared on: found at
    connect (keeps_its_session) or by the server not knowing the name, the statement
    then runs unprepared, and the process stops preparing.
    """
    form = driver_form(statement, connection.dialect)
    if form.computes_defaults:
        return fetch_on_driver(connection, statement, parameters)
    if current_app.extensions.get(PREPARED_STATEMENTS_LOST):
        return _unprepared(connection, statement, parameters)
    try:
        cursor = driver_cursor(connection, form.text, form.arguments(parameters), prepare=True)
    except exc.DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) != UNKNOWN_PREPARED_STATEMENT:
            raise
        stop_preparing(current_app, "the server session forgot a prepared statement")
        return _unprepared(connection, statement, parameters)
    return form.rows(cursor)


def _unprepared(
    connection: Connection, statement: Executable, parameters: dict[str, Any]
) -> Sequence[Any]:
    """Run ``statement`` by its text, on a connection that prepares nothing from now on.

    psycopg would otherwise run by their names the statements it prepared on it.
    """
    connection.connection.dbapi_connection.prepare_threshold = None
    return fetch_on_driver(connection, statement, parameters)


def stop_preparing(app: Flask, why: str) -> None:
    """Prepare no statement in ``app``'s process from now on."""
    log.warning("%s: prepared statements do not last on this database's sessions", why)
    app.extensions[PREPARED_STATEMENTS_LOST] = True


_SERVER_PROCESS = "SELECT pg_backend_pid()"


def keeps_its_session(dbapi_connection: Any) -> bool:
    """Tell whether a new psycopg connection talks to one server session throughout.

    Behind a pooler in transaction mode, the server process that answers is not the
    one the connection was told of at its start (the pooler's own key): a statement
    prepared in one transaction could be executed by its name in another session,
    where that name may stand for another statement.
    """
    server_process = dbapi_connection.execute(_SERVER_PROCESS).fetchone()[0]
    if not dbapi_connection.autocommit:
        dbapi_connection.rollback()
    return server_process == dbapi_connection.info.backend_pid
