"""Callers remembered by their key's digest, for as long as PostgreSQL tells of no key change.

On PostgreSQL a key's lookup is a round trip on every request, and a third of the
database's statements for a billed one (without it: 5-10% less of the gateway's CPU, and
more requests per second once the database server is busy). Each process remembers the
callers it found, and listens, on a connection of its own, to the notification a trigger
on api_keys sends whenever a key's value, state, permitted models or limit change, or a
key is removed (migration 0010). A notification forgets every caller: changes are rare,
and the next request of each key simply looks it up again.

What a remembered caller can get wrong, and for how long. A key revoked, rotated or
deleted by another process keeps answering until the notification is read, at the next
request (it is on its way as the change commits; in the process that made the change,
nothing is remembered past it). Nothing is billed on such a key meanwhile: a hold
re-checks the key's state and value in its own statement (app.credits.ledger). A caller
is remembered at most ``ENTRY_SECONDS`` in any case, which bounds what a lost
notification could leave standing; nothing is remembered while the listening connection
is down, nor behind a pooler that moves sessions (PgBouncer in transaction mode does not
deliver notifications; app.auth.keys.find_caller stops remembering once the prepared
statements show such a pooler).
SQLite has no notifications: there every request looks its key up, at a tenth of the
cost of a round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from flask import Flask
from sqlalchemy import exc
from sqlalchemy.engine import Engine

from app.database import AUTOCOMMIT_ENGINE
from app.process import process_id

log = logging.getLogger(__name__)

CALLER_CACHE = "gateway.caller_cache"
CHANNEL = "gateway_api_keys"
ENTRY_SECONDS = 30.0
MOST_ENTRIES = 10_000
# After the listening connection failed, how long lookups go uncached before a new try.
RETRY_SECONDS = 5.0


def init_caller_cache(app: Flask) -> None:
    """Remember callers where the database tells of key changes: PostgreSQL."""
    engine = app.extensions.get(AUTOCOMMIT_ENGINE)
    if engine is not None:
        # The driver's own errors (the listener's poll), or SQLAlchemy's (its connecting).
        errors = (engine.dialect.loaded_dbapi.Error, exc.DBAPIError)
        app.extensions[CALLER_CACHE] = CallerCache(lambda: listening_connection(engine), errors)


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
    last_used_at: datetime | None


class CallerCache:
    """One process's callers by key digest, forgotten whenever a key changes.

    ``connect`` opens the listening connection (a DB-API connection in autocommit);
    ``errors`` are the exceptions its driver raises when that connection fails.
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
        self._entries: dict[str, tuple[float, Remembered]] = {}
        self._listener: Any = None
        self._pid = process_id()
        self._retry_at = 0.0
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

    def note_use(self, caller: Remembered, used_at: datetime) -> None:
        """Remember that ``caller``'s key was recorded as used at ``used_at``.

        The key's last use is written at most once a minute, judged by the caller's
        ``last_used_at``: a remembered caller must carry the latest one.
        """
        entry = self._entries.get(caller.key_digest or "")
        if entry is not None and entry[1].key_id == caller.key_id:
            self._entries[caller.key_digest] = (entry[0], replace(entry[1], last_used_at=used_at))

    def _read_changes(self) -> int | None:
        """Read the notifications that arrived; None while not listening (remember nothing)."""
        if self._pid != process_id():
            # A forked child: the parent's connection and callers are not its own.
            self._pid, self._listener, self._entries = process_id(), None, {}
            self._retry_at = 0.0
        if self._listener is None and not self._listen():
            return None
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
            self.forget_all()
        return self._forgotten

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
        # Whatever changed while nobody listened.
        self.forget_all()
        self._listener = listener
        return True

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        self.forget_all()
        self._retry_at = self._clock() + RETRY_SECONDS
        _close(listener, self._errors)


def _close(connection: Any, errors: type[Exception] | tuple[type[Exception], ...]) -> None:
    try:
        connection.close()
    except errors:
        log.debug("closing a failed listening connection failed too", exc_info=True)
