"""Callers remembered by their key's digest, for as long as no key is known to have changed.

A key's lookup on every request costs a round trip on PostgreSQL (a third of the
database's statements for a billed one: without it 5-10% less of the gateway's CPU,
and more requests per second once the database server is busy), and on SQLite a read
transaction of its own (about 60 us of a whole answer's 1.1 ms, timed in the request's
flow). Each process remembers the callers it found, and forgets every one of them
whenever a key changes; changes are rare, and the next request of each key simply
looks it up again. How a process hears of a change made by another (app.database's
change notices):

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
(app.credits.holds). A caller is remembered at most ``ENTRY_SECONDS`` in any case,
which bounds what goes unheard: a lost notification, or on SQLite a change made behind
the gateway's back (an operator's SQL). Nothing is remembered while the listening
connection is down or the file cannot be read, nor behind a pooler that moves sessions
(PgBouncer in transaction mode does not deliver notifications; app.auth.keys.find_caller
stops remembering once the prepared statements show such a pooler).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from flask import Flask

from app.database import ChangeNotices, change_notices
from app.process import process_id

log = logging.getLogger(__name__)

CALLER_CACHE = "gateway.caller_cache"
# What the trigger on api_keys notifies (migration 0010).
CHANNEL = "gateway_api_keys"
ENTRY_SECONDS = 30.0
MOST_ENTRIES = 10_000
# Beside SQLite's database file, as its -wal and -shm files are.
KEY_CHANGES_SUFFIX = "-key-changes"


def init_caller_cache(app: Flask) -> None:
    """Remember callers where this process can hear of key changes (see the module)."""
    changes = change_notices(app, channel=CHANNEL, file_suffix=KEY_CHANGES_SUFFIX)
    if changes is not None:  # otherwise nothing tells of changes: every key is looked up
        app.extensions[CALLER_CACHE] = CallerCache(changes)


class Remembered(Protocol):
    """What the cache needs of a caller."""

    key_id: int
    key_digest: str | None


class CallerCache:
    """One process's callers by key digest, forgotten whenever a key changes."""

    def __init__(
        self, changes: ChangeNotices, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
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
