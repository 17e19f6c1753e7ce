"""A private PostgreSQL server whose processes callgrind counts, for bench/instructions.py.

On PostgreSQL part of a request's work is the server's: the backend of each of the
gateway's connections parses, plans and runs its statements and writes the WAL. This
machine kind has no hardware counters for ``perf stat -e instructions``, so the server
runs under callgrind as the gateway does: a cluster of its own (initdb into a temporary
directory, its own port, autovacuum off), every process it forks counted.

Counting has to start after the warm-up and stop after the counted requests, in each
backend, while the gateway keeps its connections. callgrind_control cannot reach a
backend PostgreSQL forked (tried: without --trace-children it has no vgdb; with it, the
backend dies when vgdb connects, its environment overwritten by its process title), so
the mark is a function only a signal makes a backend run.
``pg_log_backend_memory_contexts(pid)`` makes that process run
``ProcessLogMemoryContextInterrupt`` at once, even idle, and callgrind writes its
counts so far to a new file before that function starts (``--dump-before``) and
starts again from zero. Three marks: the first closes the start-up and warm-up, the
second closes the counted requests (plus the first mark's own logging), the third
closes the second's logging alone, which is subtracted.

Which process did what: the client backends are the gateway's connections (the one
asking is left out); the others (checkpointer, background writer, WAL writer,
launchers) are counted apart and not added to a request's work. Autovacuum is off: its
work is per dead row, done later, and a worker started while counting would be
counted in part.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

# The function a backend runs when asked to log its memory contexts: the mark.
MARK_FUNCTION = "ProcessLogMemoryContextInterrupt"
DATABASE = "bench"
OWNER = "postgres"


@dataclass(frozen=True)
class DatabaseWork:
    """Instructions the server's processes ran between two marks, by kind of process."""

    backends: int
    background: int
    connections: int


def server_binaries() -> Path:
    """Return the directory of the newest installed PostgreSQL server's programs."""
    found = glob.glob("/usr/lib/postgresql/*/bin/postgres")
    if not found:
        raise RuntimeError(
            "no PostgreSQL server in /usr/lib/postgresql: apt-get install postgresql"
        )
    return Path(max(found, key=lambda path: int(Path(path).parent.parent.name))).parent


def as_owner() -> dict[str, str]:
    """Return how to start a process as the cluster's owner: root may not own one."""
    return {"user": OWNER, "group": OWNER} if os.geteuid() == 0 else {}


@contextmanager
def counted_postgres(port: int) -> Iterator[tuple[str, Path]]:
    """Run a private cluster under callgrind on ``port``; yield its URL and where it counts."""
    # A directory of its own: the owner must reach it, and the caller's may be private.
    home = Path(tempfile.mkdtemp(prefix="counted-postgres-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(home, OWNER)
        with serving(home, port) as server:
            create_database(port, server)
            yield f"postgresql://{OWNER}@127.0.0.1:{port}/{DATABASE}", home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def serving(home: Path, port: int) -> Iterator[subprocess.Popen]:
    """Create a cluster in ``home``; serve it under callgrind until the block ends."""
    binaries = server_binaries()
    initdb = [str(binaries / "initdb"), "-D", str(home / "data"), "-A", "trust", "-U", OWNER]
    subprocess.run([*initdb, "--no-sync"], check=True, capture_output=True, cwd=home, **as_owner())
    command = [
        "valgrind", "--tool=callgrind", "--vgdb=no",
        f"--dump-before={MARK_FUNCTION}", f"--callgrind-out-file={home}/callgrind.%p.out",
        str(binaries / "postgres"), "-D", str(home / "data"), "-p", str(port), "-k", str(home),
        "-c", "listen_addresses=127.0.0.1", "-c", "autovacuum=off",
    ]  # fmt: skip
    with open(home / "server.log", "ab") as log:
        # Started as its owner, not through a program that would not pass the signal on.
        server = subprocess.Popen(command, stdout=log, stderr=log, cwd=home, **as_owner())
    try:
        yield server
    finally:
        server.send_signal(signal.SIGINT)  # PostgreSQL's fast shutdown
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def create_database(port: int, server: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until the server (slow to start under callgrind) answers; create the database."""
    deadline = time.monotonic() + timeout
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"PostgreSQL under callgrind exited with status {server.returncode}")
        try:
            connection = psycopg.connect(host="127.0.0.1", port=port, user=OWNER, dbname="postgres")
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    connection.autocommit = True
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {DATABASE}")
    connection.close()


class Marks:
    """The marks of one counted run, set from the process the gateway serves in."""

    def __init__(self, url: str, counts: Path) -> None:
        """Mark the server at ``url``, whose processes write their counts into ``counts``."""
        self.url = url
        self.counts = counts

    def mark(self) -> dict[int, tuple[str, int]]:
        """Have every other process of the server write its counts; return them.

        Each process's kind (``backend_type``) and instructions since its previous mark.
        """
        connection = psycopg.connect(self.url)
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, backend_type FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
            )
            kinds = dict(cursor.fetchall())
            written = {pid: self._dumps(pid) for pid in kinds}
            for pid in list(kinds):
                cursor.execute("SELECT pg_log_backend_memory_contexts(%s)", (pid,))
                if not cursor.fetchone()[0]:
                    del kinds[pid]  # it was exiting: an earlier mark's connection
        connection.close()
        return {pid: (kind, self._next_count(pid, written[pid])) for pid, kind in kinds.items()}

    def _dumps(self, pid: int) -> int:
        """Return how many times process ``pid`` wrote its counts so far."""
        return len(list(self.counts.glob(f"callgrind.{pid}.out.*")))

    def _next_count(self, pid: int, written: int, timeout: float = 120) -> int:
        """Wait for process ``pid``'s next file of counts; return its total."""
        path = self.counts / f"callgrind.{pid}.out.{written + 1}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            total = totals(path)
            if total is not None:
                return total
            time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL process {pid} did not write {path.name}")

    def counted(self, run: Callable[[], None]) -> DatabaseWork:
        """Call ``run`` between marks; return what the server's processes did meanwhile."""
        started = self.mark()
        run()
        counted = self.mark()
        logging = self.mark()
        if not set(started) == set(counted) == set(logging):
            raise RuntimeError("a connection to PostgreSQL opened or closed while counting")
        work = {pid: counted[pid][1] - logging[pid][1] for pid in counted}
        clients = [pid for pid, (kind, _) in counted.items() if kind == "client backend"]
        return DatabaseWork(
            backends=sum(work[pid] for pid in clients),
            background=sum(work.values()) - sum(work[pid] for pid in clients),
            connections=len(clients),
        )


def totals(path: Path) -> int | None:
    """Return the instructions a complete callgrind file counts; None before it is complete."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("totals:"):
            return int(line.split()[1])
    return None
