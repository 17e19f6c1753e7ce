"""Statements handed to the driver directly: compiled once, their parameters bound in one step.

The hot path's statements are compiled once and handed to the driver: SQLAlchemy's own
execution of an already compiled statement (its cache lookup, execution context and
result) costs more than the driver's work. On PostgreSQL they may be prepared once per
connection.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
from collections import namedtuple
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flask import current_app
from sqlalchemy import (
    Executable,
    exc,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Compiled, Connection, Dialect

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
    # The name it is prepared under, for forms compiled for PREPARE.
    name: str
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


# Writes the numbered parameters PREPARE takes, each cast to its type.
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


def _compiling_dialect(dialect: Dialect, for_prepare: bool) -> Dialect:
    """Return the dialect a statement for ``dialect``'s driver is compiled with."""
    if for_prepare:
        return _NUMBERED_PARAMETERS
    if dialect.paramstyle == "qmark":
        return _named_parameters(dialect)
    return dialect


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
        dialect=_compiling_dialect(dialect, for_prepare), column_keys=column_keys
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


def driver_cursor(connection: Connection, text: str, arguments: Any = None) -> Any:
    """Execute ``text`` on a cursor of ``connection``'s driver; return the cursor.

    A failure is raised as SQLAlchemy raises it (an IntegrityError is one), the
    connection invalidated if it was lost, and the pool's idle connections with it.
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
        driver_cursor(connection, f"PREPARE {form.name} AS {form.text}").close()
        prepared.add(form.name)
    arguments = form.arguments(parameters)
    markers = f"({', '.join(['%s'] * len(arguments))})" if arguments else ""
    try:
        cursor = driver_cursor(connection, f"EXECUTE {form.name}{markers}", arguments)
    except exc.DBAPIError as error:
        if getattr(error.orig, "pgcode", None) != UNKNOWN_PREPARED_STATEMENT:
            raise
        log.warning("prepared statements do not last on this database's sessions: not preparing")
        current_app.extensions[PREPARED_STATEMENTS_LOST] = True
        return fetch_on_driver(connection, statement, parameters)
    return form.rows(cursor)
