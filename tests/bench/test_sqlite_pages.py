"""bench/sqlite_pages.py reads the WAL as SQLite writes it, and names what a request writes."""

from __future__ import annotations

import struct
import subprocess
import sys

from bench.sqlite_pages import Frame, pages_by_owner, wal_frames
from tests.bench.test_run import ROOT, table_rows

PAGE_SIZE = 1024
SALTS = (0x1234, 0x5678)


def wal_header(salts: tuple[int, int] = SALTS) -> bytes:
    return struct.pack(">IIIIIIII", 0x377F0682, 3007000, PAGE_SIZE, 0, *salts, 0, 0)


def frame(page: int, pages_after_commit: int, salts: tuple[int, int] = SALTS) -> bytes:
    return struct.pack(">IIIIII", page, pages_after_commit, *salts, 0, 0) + bytes(PAGE_SIZE)


def test_the_frames_of_the_current_wal_are_read_up_to_the_first_left_from_before():
    wal = wal_header() + frame(4, 0) + frame(7, 12) + frame(9, 12, salts=(1, 2))

    assert wal_frames(wal) == [Frame(4, commits=False), Frame(7, commits=True)]


def test_an_empty_or_cut_wal_has_no_frames():
    assert wal_frames(b"") == []
    assert wal_frames(wal_header() + frame(4, 5)[:-1]) == []


def test_frames_are_counted_by_the_table_or_index_of_their_page():
    frames = [Frame(4, False), Frame(6, False), Frame(4, True), Frame(99, True)]

    counts = pages_by_owner(frames, {4: "accounts", 6: "api_keys"})

    assert counts == {"accounts": 2, "api_keys": 1, "free": 1}


def test_the_counter_names_the_tables_a_billed_request_writes():
    command = [sys.executable, "bench/sqlite_pages.py", "--warm-up", "3", "--requests", "2"]

    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 requests counted after 3" in done.stdout
    pages = {name: float(count) for name, count in table_rows(done.stdout, 2)}
    for table in ("accounts", "api_keys", "holds", "ledger_entries", "generations"):
        assert pages[table] > 0, done.stdout
