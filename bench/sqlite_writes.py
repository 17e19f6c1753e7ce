"""What SQLite's own part of a billed request costs, with no application around it.

Replays, with Python's sqlite3 alone, the statements one whole billed request runs on
SQLite (the key's lookup; the hold: two UPDATEs and an INSERT; the settlement: three
UPDATEs and two INSERTs), on a database the gateway's migrations made, with the
gateway's settings (app.database.sqlite.sqlite_pragmas: WAL, synchronous=NORMAL, the checkpoint
interval, foreign keys). The statements are those sqlite3's trace callback showed the
gateway running (commit 2f627c7), but for the charge's ledger entry: its two statements,
the entry chained after the account's head and the UPDATE that moves the balance and the
head to it, are the gateway's own (app.credits.sql.entries), in the form its driver sends
them, their digest computed by the same sha256_hex. The columns of the generation record
are read from the schema. Three ways of committing:

- ``two``: a hold's transaction and a settlement's transaction per request, as the
  gateway writes them;
- ``one``: both in one transaction per request;
- ``batch K``: K requests' holds and settlements in one transaction, as a gateway that
  committed its waiting requests together would.

It prints the CPU (user + system, this process) per request of each, and the wall time
of the slowest request: the one whose commit checkpointed the WAL. The gap between
``two`` and the floor's whole request is what the SQLite target leaves for everything
else; the batches show what writing together would save.

    .venv/bin/python bench/sqlite_writes.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy.dialects import sqlite  # noqa: E402

from app.credits.chain import epoch_micros  # noqa: E402
from app.credits.sql.entries import DEBIT_TO_NEW_HEAD, insert_chained_entry  # noqa: E402
from app.database.driver import driver_form  # noqa: E402
from app.database.sqlite import sha256_hex_of, sqlite_pragmas  # noqa: E402
from bench.run import bench_catalog, funded_key, gateway_env  # noqa: E402

WARM_UP = 320
HOLD = 3_920_000
CHARGE = 360_000
MODES = (("two", 1, True), ("one", 1, False), ("batch 8", 8, False), ("batch 32", 32, False))


def main(argv: list[str] | None = None) -> None:
    """Make a migrated database with one funded key; time each way of committing."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "gateway.sqlite3"
        env = {**os.environ, **gateway_env(f"sqlite:///{path}", bench_catalog(Path(scratch), 0))}
        funded_key(env)
        print("| commits | CPU us per request | slowest request ms |\n|---|---:|---:|")
        for name, batch, split in MODES:
            cpu, slowest = replay(path, args.requests, batch=batch, split=split)
            print(f"| {name} | {cpu:,.0f} | {slowest * 1000:,.2f} |")


def replay(path: Path, count: int, *, batch: int, split: bool) -> tuple[float, float]:
    """Replay ``count`` requests' statements; return the CPU us per request, the slowest's seconds.

    The slowest request is the one whose commit checkpointed the WAL into the database:
    a worker stalls that long, all of its requests with it.
    """
    connection = sqlite3.connect(path, isolation_level=None)
    connection.create_function("sha256_hex", 1, sha256_hex_of, deterministic=True)
    page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    for pragma in sqlite_pragmas(page_size):
        connection.execute(f"PRAGMA {pragma}")
    digest, key_id, account_id = connection.execute(
        "SELECT digest, id, account_id FROM api_keys"
    ).fetchone()
    columns = [row[1] for row in connection.execute("PRAGMA table_info(generations)")]
    request = Request(connection, digest, key_id, account_id, columns)
    for index in range(WARM_UP):
        request.run(index, batch=batch, split=split)
    if connection.in_transaction:
        connection.execute("COMMIT")
    started, slowest = time.process_time(), 0.0
    for index in range(count):
        began = time.perf_counter()
        request.run(index, batch=batch, split=split)
        slowest = max(slowest, time.perf_counter() - began)
    if connection.in_transaction:
        connection.execute("COMMIT")
    connection.close()
    return (time.process_time() - started) * 1e6 / count, slowest


class Request:
    """The statements of one billed request, parameterised as the gateway sends them."""

    def __init__(
        self, connection: sqlite3.Connection, digest: str, key_id: int, account_id: int,
        columns: list[str],
    ) -> None:  # fmt: skip
        self.connection = connection
        self.digest, self.key_id, self.account_id = digest, key_id, account_id
        self.columns = columns
        self.chained_entry = driver_form(insert_chained_entry(None), sqlite.dialect()).text
        self.debit_to_new_head = driver_form(DEBIT_TO_NEW_HEAD, sqlite.dialect()).text

    def run(self, index: int, *, batch: int, split: bool) -> None:
        """Run request number ``index``; commit as ``batch`` and ``split`` say."""
        execute = self.connection.execute
        execute(
            "SELECT id, account_id, state, last_used_at, permitted_models, budget, budget_window, "
            "window_start FROM api_keys WHERE digest = ?",
            (self.digest,),
        ).fetchall()
        hold_id = uuid.uuid4().hex
        moment = datetime.now(UTC)
        now = moment.replace(tzinfo=None).isoformat(" ")
        if index % batch == 0:
            execute("BEGIN IMMEDIATE")
        self.hold(hold_id, now)
        if split:
            execute("COMMIT")
            execute("BEGIN IMMEDIATE")
        self.settle(hold_id, now, epoch_micros(moment))
        if index % batch == batch - 1:
            execute("COMMIT")

    def hold(self, hold_id: str, now: str) -> None:
        """Reserve on the account and the key; record the hold."""
        execute = self.connection.execute
        execute(
            "UPDATE accounts SET reserved = reserved + ? WHERE id = ? AND balance - reserved >= ?",
            (HOLD, self.account_id, HOLD),
        )
        execute(
            "UPDATE api_keys SET window_reserved = window_reserved + ? WHERE id = ?",
            (HOLD, self.key_id),
        )
        execute(
            "INSERT INTO holds (id, account_id, amount, api_key_id, status, created_at, "
            "expires_at) VALUES (?, ?, ?, ?, 'open', ?, ?)",
            (hold_id, self.account_id, HOLD, self.key_id, now, now),
        )

    def settle(self, hold_id: str, now: str, micros: int) -> None:
        """Close the hold; chain its charge, charging the account; charge the key; record it."""
        execute = self.connection.execute
        execute("UPDATE holds SET status = 'settled' WHERE id = ? AND status = 'open'", (hold_id,))
        generation_id = "chatcmpl-" + uuid.uuid4().hex[:24]
        entry = {
            "entry_kind": "charge",
            "charge": CHARGE,
            "entry_generation": generation_id,
            "entry_reference": None,
            "entry_note": None,
            "entry_at": now,
            "entry_micros": micros,
            "account_id": self.account_id,
        }
        execute(self.chained_entry, entry)
        execute(
            self.debit_to_new_head,
            {"charge": CHARGE, "released": HOLD, "account_id": self.account_id},
        )
        execute(
            "UPDATE api_keys SET window_spent = window_spent + ?, "
            "window_reserved = window_reserved - ? WHERE id = ?",
            (CHARGE, HOLD, self.key_id),
        )
        values = dict.fromkeys(self.columns, 0)
        values.update(
            id=generation_id, account_id=self.account_id, api_key_id=self.key_id,
            model="bench-fast", status="completed", finish_reason="stop", created_at=now,
            request_id="req_" + generation_id[-24:], cost=CHARGE, upstream_attempts=None,
            time_to_first_token_ms=None,
        )  # fmt: skip
        names, placeholders = ", ".join(values), ", ".join("?" * len(values))
        statement = f"INSERT INTO generations ({names}) VALUES ({placeholders})"
        execute(statement, tuple(values.values()))


if __name__ == "__main__":
    main()
