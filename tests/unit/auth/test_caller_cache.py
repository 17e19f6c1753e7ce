"""The per-process memory of callers: its own rules, and how each database's changes reach it.

PostgreSQL's listening connection is a stand-in here; SQLite's file of changes is real,
shared by caches as processes share it. What the databases do with real processes (the
trigger, the notifications, the flask commands' changes) is tested over HTTP in
tests/contract/test_remembered_callers.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.auth import caller_cache
from app.auth.caller_cache import CHANNEL, ENTRY_SECONDS, CallerCache
from app.database.notices import RETRY_SECONDS, ListenedNotices, NoticesFile


class ConnectionLost(Exception):
    """The stand-in driver's error."""


class Listener:
    """A listening connection: notifications and notices are appended, poll() may fail."""

    def __init__(self) -> None:
        self.notifies: list[str] = []
        self.notices: list[str] = []
        self.listened: list[str] = []
        self.closed = False
        self.lost = False

    def listen(self, channel: str) -> None:
        self.listened.append(channel)

    def close(self) -> None:
        self.closed = True

    def poll(self) -> None:
        if self.lost:
            raise ConnectionLost()


@dataclass(frozen=True)
class Caller:
    key_id: int
    key_digest: str | None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def world():
    """A cache, its listeners (one per connection opened), its clock and its lookups."""
    listeners: list[Listener] = []
    lookups: list[str] = []
    clock = Clock()

    def connect() -> Listener:
        listeners.append(Listener())
        return listeners[-1]

    def look_up(digest: str) -> Caller:
        lookups.append(digest)
        return Caller(key_id=len(lookups), key_digest=digest)

    cache = CallerCache(
        ListenedNotices(connect, ConnectionLost, channel=CHANNEL, clock=clock), clock=clock
    )
    return cache, listeners, lookups, look_up, clock


def test_a_caller_is_looked_up_once_while_no_key_changes(world):
    cache, listeners, lookups, look_up, _ = world

    first = cache.find("d1", look_up)
    again = cache.find("d1", look_up)

    assert again is first and lookups == ["d1"]
    assert listeners[0].listened == [CHANNEL]


def test_a_notification_forgets_every_caller(world):
    cache, listeners, lookups, look_up, _ = world
    cache.find("d1", look_up)
    cache.find("d2", look_up)

    listeners[0].notifies.append("gateway_api_keys")
    cache.find("d1", look_up)
    cache.find("d2", look_up)

    assert lookups == ["d1", "d2", "d1", "d2"] and listeners[0].notifies == []


def test_a_lookup_overtaken_by_a_change_is_not_remembered(world):
    cache, listeners, lookups, _, _ = world

    def look_up_while_a_key_changes(digest: str) -> Caller:
        # The row read may predate the change whose notification arrives meanwhile.
        listeners[0].notifies.append("gateway_api_keys")
        lookups.append(digest)
        return Caller(key_id=1, key_digest=digest)

    cache.find("d1", look_up_while_a_key_changes)
    cache.find("d1", look_up_while_a_key_changes)

    assert lookups == ["d1", "d1"]


def test_a_change_made_by_this_process_forgets_at_once(world):
    cache, _, lookups, look_up, _ = world
    cache.find("d1", look_up)

    cache.key_changed()
    cache.find("d1", look_up)

    assert lookups == ["d1", "d1"]


def test_a_caller_is_remembered_for_entry_seconds_at_most(world):
    cache, _, lookups, look_up, clock = world
    cache.find("d1", look_up)

    clock.now += ENTRY_SECONDS - 1
    cache.find("d1", look_up)
    clock.now += 2
    cache.find("d1", look_up)

    assert lookups == ["d1", "d1"]


def test_nothing_is_remembered_while_the_listener_is_down(world):
    cache, listeners, lookups, look_up, clock = world
    cache.find("d1", look_up)

    listeners[0].lost = True
    cache.find("d1", look_up)
    cache.find("d1", look_up)
    clock.now += RETRY_SECONDS
    cache.find("d1", look_up)
    cache.find("d1", look_up)

    # Lost: looked up twice without memory; listening again after the pause: once.
    assert lookups == ["d1", "d1", "d1", "d1"]
    assert listeners[0].closed and len(listeners) == 2


def test_the_servers_last_word_stops_the_listening(world):
    # A terminated session's FATAL message is read as a notice; poll() fails only after.
    cache, listeners, lookups, look_up, _ = world
    cache.find("d1", look_up)

    listeners[0].notices.append("FATAL: terminating connection due to administrator command")
    cache.find("d1", look_up)

    assert lookups == ["d1", "d1"] and listeners[0].closed


def test_a_failure_to_listen_looks_every_key_up_until_the_next_try(world):
    cache, listeners, lookups, look_up, clock = world
    attempts = []

    def connect() -> Listener:
        attempts.append(clock.now)
        if len(attempts) == 1:
            raise ConnectionLost()
        listeners.append(Listener())
        return listeners[-1]

    cache = CallerCache(
        ListenedNotices(connect, ConnectionLost, channel=CHANNEL, clock=clock), clock=clock
    )
    cache.find("d1", look_up)
    cache.find("d1", look_up)
    clock.now += RETRY_SECONDS
    cache.find("d1", look_up)
    cache.find("d1", look_up)

    assert lookups == ["d1", "d1", "d1"] and len(attempts) == 2


def test_a_forked_process_starts_with_its_own_listener_and_no_callers(world, monkeypatch):
    cache, listeners, lookups, look_up, _ = world
    cache.find("d1", look_up)

    monkeypatch.setattr(caller_cache, "process_id", lambda: -1)
    cache.find("d1", look_up)

    assert lookups == ["d1", "d1"] and len(listeners) == 2


@pytest.fixture
def processes(tmp_path):
    """Two processes' caches on SQLite: one file of changes, beside the database."""
    path = str(tmp_path / "gateway.sqlite3-key-changes")
    lookups: list[str] = []

    def look_up(digest: str) -> Caller:
        lookups.append(digest)
        return Caller(key_id=len(lookups), key_digest=digest)

    return CallerCache(NoticesFile(path)), CallerCache(NoticesFile(path)), lookups, look_up


def test_on_sqlite_a_change_another_process_made_forgets_at_the_next_request(processes):
    serving, changing, lookups, look_up = processes
    serving.find("d1", look_up)
    serving.find("d1", look_up)

    changing.key_changed()
    serving.find("d1", look_up)
    serving.find("d1", look_up)

    assert lookups == ["d1", "d1"]


def test_on_sqlite_a_lookup_overtaken_by_another_process_change_is_not_remembered(processes):
    serving, changing, lookups, _ = processes

    def look_up_while_a_key_changes(digest: str) -> Caller:
        changing.key_changed()
        lookups.append(digest)
        return Caller(key_id=1, key_digest=digest)

    serving.find("d1", look_up_while_a_key_changes)
    serving.find("d1", look_up_while_a_key_changes)

    assert lookups == ["d1", "d1"]


def test_on_sqlite_nothing_is_remembered_while_the_file_cannot_be_read(processes, tmp_path):
    serving, _, lookups, look_up = processes
    serving.find("d1", look_up)

    (tmp_path / "gateway.sqlite3-key-changes").unlink()
    serving.find("d1", look_up)
    serving.find("d1", look_up)

    assert lookups == ["d1", "d1", "d1"]


def test_on_sqlite_a_change_that_cannot_be_announced_is_logged(tmp_path, caplog):
    changes = NoticesFile(str(tmp_path / "gone" / "gateway.sqlite3-key-changes"))

    changes.announce()

    assert changes.read() is None
    assert "could not announce a change" in caplog.text
