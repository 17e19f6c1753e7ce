"""Every SQLite connection gets the gateway's settings; a new database, its page size."""

from __future__ import annotations

import sqlite3

from sqlalchemy import create_engine, text

from app.database.sqlite import SQLITE_PAGE_SIZE, SQLITE_WAL_BYTES_BEFORE_CHECKPOINT

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
