"""Change notices: how a process hears that something others may have changed did change.

A process that remembers rows (the callers of API keys) must forget them when they
change, whoever changed them. How it hears of a change depends on the database:

- PostgreSQL: a listening connection of the process's own, to what a trigger notifies.
- SQLite, which has no notifications: a file beside the database, to which every change
  made through the gateway appends a byte once committed, read by its size.

Neither is there for an in-memory SQLite database: nothing can be remembered then.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from flask import Flask
from sqlalchemy import exc
from sqlalchemy.engine import Engine

from app.database.connections import AUTOCOMMIT_ENGINE
from app.extensions import db

log = logging.getLogger(__name__)

# After the listening connection failed, how long nothing is heard before a new try.
RETRY_SECONDS = 5.0


class ChangeNotices(Protocol):
    """How a process hears that something changed, and tells the others."""

    def read(self) -> bool | None:
        """Tell whether a change was announced since the last read; None: cannot tell."""

    def announce(self) -> None:
        """Tell every process that something changed, after the change committed."""

    def forked(self) -> None:
        """Drop what belongs to the parent process, in a forked child."""


def change_notices(app: Flask, *, channel: str, file_suffix: str) -> ChangeNotices | None:
    """Return how this process hears of changes: ``channel``'s notifications, or a file.

    None when it cannot hear of them (an in-memory database).
    """
    engine = app.extensions.get(AUTOCOMMIT_ENGINE)
    if engine is not None:
        # The driver's own errors (the listener's poll), or SQLAlchemy's (its connecting).
        errors = (engine.dialect.loaded_dbapi.Error, exc.DBAPIError)
        return ListenedNotices(lambda: listening_connection(engine), errors, channel=channel)
    with app.app_context():
        url = db.engine.url
    if url.get_backend_name() != "sqlite" or not _is_file_path(url.database):
        return None
    return NoticesFile(url.database + file_suffix)


def _is_file_path(database: str | None) -> bool:
    return bool(database) and database != ":memory:" and not database.startswith("file:")


def listening_connection(engine: Engine) -> Listener:
    """Return a listener on a DB-API connection of ``engine``'s, taken out of its pool."""
    pooled = engine.raw_connection()
    connection = pooled.dbapi_connection
    pooled.detach()
    connection.autocommit = True
    return Listener(connection)


class Listener:
    """A psycopg connection that only listens, read through libpq without a round trip.

    ``poll`` reads what arrived into ``notifies`` (the channels notified) and
    ``notices`` (what else the server said: on a connection that only listens, its last
    word before it ends the session); it raises psycopg's error once the connection
    failed.
    """

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.notifies: list[str] = []
        self.notices: list[str] = []
        connection.add_notice_handler(self._noticed)

    def listen(self, channel: str) -> None:
        """Listen to ``channel``."""
        self.connection.execute(f"LISTEN {channel}")

    def poll(self) -> None:
        """Read what the server sent since the last poll, without waiting for more."""
        libpq = self.connection.pgconn
        libpq.consume_input()
        while (notification := libpq.notifies()) is not None:
            self.notifies.append(notification.relname.decode())

    def close(self) -> None:
        """Close the connection."""
        self.connection.close()

    def _noticed(self, diagnostic: Any) -> None:
        self.notices.append(f"{diagnostic.severity}: {diagnostic.message_primary}")


class NoticesFile:
    """SQLite's notices: a file that grows by a byte with every change, read by its size.

    Appending is atomic, so no two processes' changes ever make one size; a size differs
    from the last one read as soon as any change was announced since.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._size: int | None = None
        try:
            with open(path, "ab"):
                pass
        except OSError as error:
            log.warning("cannot keep %s (%s): nothing will be remembered", path, error.strerror)

    def read(self) -> bool | None:
        """Tell whether the file grew (or was replaced) since the last read."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            self._size = None
            return None
        changed, self._size = size != self._size, size
        return changed

    def announce(self) -> None:
        """Append a byte; other processes forget their callers at their next request."""
        try:
            with open(self.path, "ab") as changes:
                changes.write(b"\n")
        except OSError as error:
            # What others remember outlives the change only as long as they keep it.
            log.warning("could not announce a change in %s: %s", self.path, error.strerror)

    def forked(self) -> None:
        """Nothing is the parent's: the file is read by its path."""


class ListenedNotices:
    """PostgreSQL's notices: notifications on a listening connection of this process's own.

    ``connect`` opens the listening connection (a Listener);
    ``errors`` are the exceptions its driver raises when that connection fails;
    ``channel`` is what a trigger notifies on every change, whatever made it.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        errors: type[Exception] | tuple[type[Exception], ...],
        *,
        channel: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._errors = errors
        self._clock = clock
        self._listener: Any = None
        self._retry_at = 0.0

    def read(self) -> bool | None:
        """Read the notifications that arrived; None while not listening."""
        if self._listener is None:
            if not self._listen():
                return None
            return True  # whatever changed while nobody listened
        try:
            self._listener.poll()
        except self._errors:
            log.warning("stopped listening for changes: its connection failed")
            self._stop_listening()
            return None
        if self._listener.notices:
            # A connection that only listens hears nothing else but the server's last
            # word before it ends the session (a restart, a terminated backend): poll()
            # reads it without failing, and notifications sent since are lost.
            log.warning("stopped listening for changes: %s", self._listener.notices[-1].strip())
            self._stop_listening()
            return None
        if self._listener.notifies:
            self._listener.notifies.clear()
            return True
        return False

    def announce(self) -> None:
        """Nothing to do: the trigger notifies every listener."""

    def forked(self) -> None:
        """Leave the parent's listening connection to the parent."""
        self._listener, self._retry_at = None, 0.0

    def _listen(self) -> bool:
        if self._clock() < self._retry_at:
            return False
        # Connecting yields to the worker's other requests: they look their keys up
        # meanwhile rather than open listeners of their own.
        self._retry_at = self._clock() + RETRY_SECONDS
        listener = None
        try:
            listener = self._connect()
            listener.listen(self._channel)
        except self._errors:
            log.warning(
                "cannot listen for changes on %s: nothing remembered meanwhile", self._channel
            )
            if listener is not None:
                _close(listener, self._errors)
            return False
        self._listener = listener
        return True

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        self._retry_at = self._clock() + RETRY_SECONDS
        _close(listener, self._errors)


def _close(connection: Any, errors: type[Exception] | tuple[type[Exception], ...]) -> None:
    try:
        connection.close()
    except errors:
        log.debug("closing a failed listening connection failed too", exc_info=True)
