"""SQLite: every connection's settings, and the writer that queues a process's writes."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.database import sqlite as app_database
from app.database.sqlite import (
    SQLITE_PAGE_SIZE,
    SQLITE_WAL_BYTES_BEFORE_CHECKPOINT,
    SQLiteWriter,
    sqlite_writer_engine,
)
from app.observability import metrics

_NOTE = text("INSERT INTO notes (word) VALUES (:word)")


@pytest.fixture
def database(tmp_path) -> Iterator[str]:
    path = tmp_path / "writes.sqlite3"
    with sqlite3.connect(path) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, word TEXT UNIQUE NOT NULL)")
    yield str(path)


def note(word: str) -> Callable[[Connection], int]:
    def write(connection: Connection) -> int:
        return connection.execute(_NOTE, {"word": word}).rowcount

    return write


def notes(*words: str) -> Callable[[Connection], None]:
    def write(connection: Connection) -> None:
        for word in words:
            note(word)(connection)

    return write


def words(path: str) -> set[str]:
    with sqlite3.connect(path) as reader:
        return {word for (word,) in reader.execute("SELECT word FROM notes")}


def shared_commits() -> tuple[float, float]:
    """The commits of more than one write so far, and the writes they carried."""
    read = metrics.registry.get_sample_value
    return (
        read("gateway_sqlite_shared_commit_writes_count") or 0.0,
        read("gateway_sqlite_shared_commit_writes_sum") or 0.0,
    )


def run_in_threads(
    writer: SQLiteWriter, writes: dict[str, Callable]
) -> tuple[dict[str, object], list[threading.Thread]]:
    """Start each write in a thread of its own, in order: their outcomes fill the dict."""
    outcomes: dict[str, object] = {}

    def run(name: str, work: Callable) -> None:
        try:
            outcomes[name] = writer.run(work)
        except Exception as error:  # the outcome under test
            outcomes[name] = error

    threads = [threading.Thread(target=run, args=item) for item in writes.items()]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # each queues behind the one before
    return outcomes, threads


def test_writes_queued_behind_the_lock_commit_together_and_fail_alone(database):
    writer = SQLiteWriter(sqlite_writer_engine(create_engine(f"sqlite:///{database}")))
    other_process = sqlite3.connect(database, isolation_level=None)
    other_process.execute("BEGIN IMMEDIATE")
    before = shared_commits()

    outcomes, threads = run_in_threads(
        writer,
        {
            "first": note("one"),
            "second": note("two"),
            "again": notes("four", "one"),  # fails at its second note: neither is kept
            "last": note("three"),
        },
    )
    time.sleep(0.2)
    assert outcomes == {}, "no write could have committed while another process held the lock"
    other_process.execute("ROLLBACK")
    for thread in threads:
        thread.join(timeout=30)

    assert outcomes["first"] == outcomes["second"] == outcomes["last"] == 1
    assert isinstance(outcomes["again"], IntegrityError)
    assert words(database) == {"one", "two", "three"}
    count, carried = shared_commits()
    assert (count - before[0], carried - before[1]) == (1, 4)


def test_a_write_alone_is_committed_or_rolled_back_alone(database):
    writer = SQLiteWriter(sqlite_writer_engine(create_engine(f"sqlite:///{database}")))

    def note_then_fail(connection: Connection) -> None:
        note("lost")(connection)
        raise LookupError("the write changed its mind")

    before = shared_commits()
    assert writer.run(note("kept")) == 1
    with pytest.raises(LookupError):
        writer.run(note_then_fail)
    assert writer.run(note("after")) == 1

    assert words(database) == {"kept", "after"}
    assert shared_commits() == before


def test_at_most_the_limit_of_writes_commit_together(database):
    writer = SQLiteWriter(
        sqlite_writer_engine(create_engine(f"sqlite:///{database}")), most_per_commit=2
    )
    other_process = sqlite3.connect(database, isolation_level=None)
    other_process.execute("BEGIN IMMEDIATE")
    before = shared_commits()

    outcomes, threads = run_in_threads(writer, {word: note(word) for word in "abcde"})
    other_process.execute("ROLLBACK")
    for thread in threads:
        thread.join(timeout=30)

    assert outcomes == dict.fromkeys("abcde", 1)
    assert words(database) == set("abcde")
    count, carried = shared_commits()
    # Two commits of two; the fifth write committed alone.
    assert (count - before[0], carried - before[1]) == (2, 4)


class Interrupted(BaseException):
    """What a killed greenlet raises in its request: no Exception, nothing catches it."""


def test_an_interrupted_write_leaves_the_connection_ready_for_the_next(database):
    # The writer keeps its connection between writes: a transaction left open would
    # refuse every later one.
    writer = SQLiteWriter(sqlite_writer_engine(create_engine(f"sqlite:///{database}")))

    def interrupted(connection: Connection) -> None:
        note("lost")(connection)
        raise Interrupted()

    with pytest.raises(Interrupted):
        writer.run(interrupted)
    assert writer.run(note("next")) == 1

    assert words(database) == {"next"}


def test_a_forked_process_writes_on_a_connection_of_its_own(database, monkeypatch):
    writer = SQLiteWriter(sqlite_writer_engine(create_engine(f"sqlite:///{database}")))
    used = []

    def note_on(word: str) -> Callable[[Connection], int]:
        def write(connection: Connection) -> int:
            used.append(connection.connection.dbapi_connection)
            return note(word)(connection)

        return write

    writer.run(note_on("parent"))
    writer.run(note_on("parent again"))
    monkeypatch.setattr(app_database, "process_id", lambda: -1)
    writer.run(note_on("child"))

    assert used[0] is used[1] and used[2] is not used[0]
    assert words(database) == {"parent", "parent again", "child"}


PRAGMAS = ("page_size", "journal_mode", "synchronous", "wal_autocheckpoint", "foreign_keys")


def settings_seen(path) -> dict[str, object]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            read = {name: connection.execute(text(f"PRAGMA {name}")).scalar() for name in PRAGMAS}
            connection.execute(text("CREATE TABLE IF NOT EXISTS notes (word TEXT)"))
            connection.commit()
        return read
    finally:
        engine.dispose()


def test_a_new_database_gets_small_pages_and_a_checkpoint_every_4_mib_of_wal(tmp_path):
    path = tmp_path / "new.sqlite3"

    seen = settings_seen(path)

    assert seen["page_size"] == SQLITE_PAGE_SIZE == 1024
    assert seen["wal_autocheckpoint"] == SQLITE_WAL_BYTES_BEFORE_CHECKPOINT // 1024 == 4096
    assert seen["journal_mode"] == "wal"
    assert seen["synchronous"] == 1  # NORMAL
    assert seen["foreign_keys"] == 1
    with sqlite3.connect(path) as reopened:
        assert reopened.execute("PRAGMA page_size").fetchone() == (1024,)


def test_an_existing_database_keeps_its_page_size_and_checkpoints_by_the_same_bytes(tmp_path):
    path = tmp_path / "existing.sqlite3"
    with sqlite3.connect(path) as made_earlier:
        made_earlier.execute("PRAGMA page_size=4096")
        made_earlier.execute("PRAGMA journal_mode=WAL")
        made_earlier.execute("CREATE TABLE notes (word TEXT)")

    seen = settings_seen(path)

    assert seen["page_size"] == 4096
    assert seen["wal_autocheckpoint"] == SQLITE_WAL_BYTES_BEFORE_CHECKPOINT // 4096 == 1024
