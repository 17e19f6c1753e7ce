"""Callers remembered by their key's digest, for as long as no key is known to have changed.

A key's lookup on every request costs a round trip on PostgreSQL (a third of the
database's statements for a billed one: without it 5-10% less of the gateway's CPU,
and more requests per second once the database server is busy), and on SQLite a read
transaction of its own (about 60 us of a whole answer's 1.1 ms, timed in the request's
flow). Each process remembers the callers it found, and forgets every one of them
whenever a key changes; changes are rare, and the next request of each key simply
looks it up again. How a process hears of a change made by another:

- PostgreSQL: a listening connection of its own, to the notification a trigger on
  api_keys sends whenever a key's value, state, permitted models or limit change, or a
  key is removed (migration 0010), whatever made the change.
- SQLite, which has no notifications: a file beside the database, to which every
  change of a key made through the gateway (its dashboard, its flask commands) appends
  a byte once committed. Its size is read on every request (one ``stat``).

What a remembered caller can get wrong, and for how long. A key revoked, rotated or
deleted by another process keeps answering until the change is heard, at the next
request (the notification or the byte is on its way as the change commits; in the
process that made the change, nothing is remembered past it). Nothing is billed on
such a key meanwhile: a hold re-checks the key's state and value in its own statement
(app.credits.ledger). A caller is remembered at most ``ENTRY_SECONDS`` in any case,
which bounds what goes unheard: a lost notification, or on SQLite a change made behind
the gateway's back (an operator's SQL). Nothing is remembered while the listening
connection is down or the file cannot be read, nor behind a pooler that moves sessions
(PgBouncer in transaction mode does not deliver notifications; app.auth.keys.find_caller
stops remembering once the prepared statements show such a pooler).
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

from app.database import AUTOCOMMIT_ENGINE
from app.extensions import db
from app.process import process_id

log = logging.getLogger(__name__)

CALLER_CACHE = "gateway.caller_cache"
CHANNEL = "gateway_api_keys"
ENTRY_SECONDS = 30.0
MOST_ENTRIES = 10_000
# After the listening connection failed, how long lookups go uncached before a new try.
RETRY_SECONDS = 5.0
# Beside SQLite's database file, as its -wal and -shm files are.
KEY_CHANGES_SUFFIX = "-key-changes"


def init_caller_cache(app: Flask) -> None:
    """Remember callers where this process can hear of key changes (see the module)."""
    engine = app.extensions.get(AUTOCOMMIT_ENGINE)
    if engine is not None:
        # The driver's own errors (the listener's poll), or SQLAlchemy's (its connecting).
        errors = (engine.dialect.loaded_dbapi.Error, exc.DBAPIError)
        changes: KeyChanges = NotifiedKeyChanges(lambda: listening_connection(engine), errors)
    else:
        with app.app_context():
            url = db.engine.url
        if url.get_backend_name() != "sqlite" or not _is_file_path(url.database):
            return  # no file to hear of changes through: every key is looked up
        changes = KeyChangesFile(url.database + KEY_CHANGES_SUFFIX)
    app.extensions[CALLER_CACHE] = CallerCache(changes)


def _is_file_path(database: str | None) -> bool:
    return bool(database) and database != ":memory:" and not database.startswith("file:")


def listening_connection(engine: Engine) -> Any:
    """Return a DB-API connection of ``engine``'s (autocommit), taken out of its pool."""
    pooled = engine.raw_connection()
    connection = pooled.dbapi_connection
    pooled.detach()
    return connection


class Remembered(Protocol):
    """What the cache needs of a caller."""

    key_id: int
    key_digest: str | None


class KeyChanges(Protocol):
    """How a process hears that a key changed, and tells the others."""

    def read(self) -> bool | None:
        """Tell whether a key changed since the last read; None when it cannot be told."""

    def announce(self) -> None:
        """Tell every process that a key changed, after the change committed."""

    def forked(self) -> None:
        """Drop what belongs to the parent process, in a forked child."""


class CallerCache:
    """One process's callers by key digest, forgotten whenever a key changes."""

    def __init__(self, changes: KeyChanges, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._changes = changes
        self._clock = clock
        self._entries: dict[str, tuple[float, Remembered]] = {}
        self._pid = process_id()
        # How many times everything was forgotten: a lookup that began before a change
        # must not be remembered after it.
        self._forgotten = 0

    def find(self, digest: str, look_up: Callable[[str], Remembered | None]) -> Any:
        """Return the caller of ``digest``, remembered or else found by ``look_up``."""
        seen = self._read_changes()
        if seen is None:
            return look_up(digest)
        entry = self._entries.get(digest)
        if entry is not None and self._clock() - entry[0] < ENTRY_SECONDS:
            return entry[1]
        caller = look_up(digest)
        if caller is not None and self._read_changes() == seen:
            if len(self._entries) >= MOST_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (self._clock(), caller)
        return caller

    def forget_all(self) -> None:
        """Forget every caller: a key changed."""
        self._forgotten += 1
        self._entries.clear()

    def key_changed(self) -> None:
        """Forget every caller, and tell the other processes: this one changed a key."""
        self.forget_all()
        self._changes.announce()

    def _read_changes(self) -> int | None:
        """Hear of the changes made since; None while they cannot be heard (remember nothing)."""
        if self._pid != process_id():
            # A forked child: the parent's callers (and listener) are not its own.
            self._pid, self._entries = process_id(), {}
            self._changes.forked()
        changed = self._changes.read()
        if changed is not False:  # a change, or no way to tell: nothing stays remembered
            self.forget_all()
        return None if changed is None else self._forgotten


class KeyChangesFile:
    """SQLite's changes: a file that grows by a byte with every change, read by its size.

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
            log.warning("cannot keep %s (%s): looking every key up", path, error.strerror)

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
            # Other processes hear of it within ENTRY_SECONDS; nothing is billed on the
            # key meanwhile (the hold re-checks it).
            log.warning("could not announce a key change in %s: %s", self.path, error.strerror)

    def forked(self) -> None:
        """Nothing is the parent's: the file is read by its path."""


class NotifiedKeyChanges:
    """PostgreSQL's changes: notifications on a listening connection of this process's own.

    ``connect`` opens the listening connection (a DB-API connection in autocommit);
    ``errors`` are the exceptions its driver raises when that connection fails. The
    trigger on api_keys announces every change, whatever made it.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        errors: type[Exception] | tuple[type[Exception], ...],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
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
            log.warning("stopped listening for key changes: its connection failed")
            self._stop_listening()
            return None
        if self._listener.notices:
            # A connection that only listens hears nothing else but the server's last
            # word before it ends the session (a restart, a terminated backend): poll()
            # reads it without failing, and notifications sent since are lost.
            log.warning("stopped listening for key changes: %s", self._listener.notices[-1].strip())
            self._stop_listening()
            return None
        if self._listener.notifies:
            self._listener.notifies.clear()
            return True
        return False

    def announce(self) -> None:
        """Nothing to do: the trigger on api_keys notifies every listener."""

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
            cursor = listener.cursor()
            cursor.execute(f"LISTEN {CHANNEL}")
            cursor.close()
        except self._errors:
            log.warning("cannot listen for key changes: looking every key up meanwhile")
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
