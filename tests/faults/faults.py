"""The fault run's faults: a schedule drawn from the seed, and how each fault is done.

Every fault is bounded in time. A killed worker is chosen, among gunicorn's workers, as
the one serving the most streams that have delivered text for a while (found through
/proc), so that a kill very likely lands on a stream that must be billed. On PostgreSQL
the gateway's server connections are terminated either under load ("open": holds and
reads meet them) or "quiet": new requests are held back first, so that the next
statements to meet the dead connections are the settlements of the streams in flight.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy

from tests.conftest import LiveServer, _free_port, running_server
from tests.contract.test_holds import child_pids
from tests.contract.test_rate_limits import redis_cli
from tests.faults.load import Load

KILL, PAUSE_REDIS, STOP_UPSTREAM, RESTART = "kill_worker", "pause_redis", "stop_upstream", "restart"
TERMINATE_OPEN, TERMINATE_QUIET = "terminate_open", "terminate_quiet"
# Faults happen within this part of the run, so that the last one is followed by load.
FAULT_WINDOW = (0.1, 0.8)
# A kill looks for streams delivering text this long: well past the 1.5 s after which
# check 5 wants a broken stream billed, so that a kill is sure to test it.
LONG_STREAM_SECONDS = 2.0
# How long a kill waits at most for two such streams to be in flight, and a quiet
# termination for two streams of any length.
KILL_WAIT_SECONDS = 5
UPSTREAM_STOP_SECONDS = 3.0
REDIS_PAUSE_MS = 3000
# A restart waits this long at most for the old master, which lets streams finish.
MASTER_EXIT_SECONDS = 45


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: when (seconds into the load) and what."""

    at: float
    kind: str


def fault_schedule(seed: int, seconds: float, postgres: bool) -> list[Fault]:
    """Draw the run's faults from ``seed``, spread over the fault window, one per slot."""
    rng = random.Random(seed)
    kinds = [KILL] * rng.choice((2, 3)) + [PAUSE_REDIS, STOP_UPSTREAM, RESTART]
    if postgres:
        kinds += [TERMINATE_OPEN, TERMINATE_QUIET, rng.choice((TERMINATE_OPEN, TERMINATE_QUIET))]
    rng.shuffle(kinds)
    start, end = (seconds * part for part in FAULT_WINDOW)
    slot = (end - start) / len(kinds)
    return [
        Fault(round(start + slot * (index + rng.uniform(0.1, 0.9)), 2), kind)
        for index, kind in enumerate(kinds)
    ]


class Gateway:
    """gunicorn serving the app on one port for the whole run, across restarts."""

    def __init__(self, database_url: str, log_dir: Path, catalog: str, env: dict[str, str]):
        self.database_url = database_url
        self.log_dir = log_dir
        self.catalog = catalog
        self.env = env
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.starts = 0
        self.server: LiveServer | None = None
        self._stack = ExitStack()

    def __enter__(self) -> Gateway:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    def start(self) -> None:
        """Start a master on the run's port; each start logs to a folder of its own."""
        self.starts += 1
        log_dir = self.log_dir / f"start-{self.starts}"
        log_dir.mkdir()
        self.server = self._stack.enter_context(
            running_server(
                self.database_url, log_dir, catalog=self.catalog, port=self.port, **self.env
            )
        )

    def restart(self) -> None:
        """Stop the master as an operator does (SIGTERM: streams finish), start another."""
        process = self.server.process
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=MASTER_EXIT_SECONDS)
        self.start()

    def workers(self) -> list[int]:
        """Return the current master's worker processes, by pid."""
        return sorted(child_pids(self.server.process.pid))

    def logs(self) -> str:
        """Return every start's gunicorn log."""
        return "".join(path.read_text() for path in sorted(self.log_dir.glob("*/gunicorn-*.log")))


def connected_client_ports(pid: int, port: int) -> set[int]:
    """Return the remote ports of ``pid``'s TCP connections to its local ``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, inode = fields[1], fields[2], fields[9]
            if inode in inodes and int(local.rsplit(":", 1)[1], 16) == port:
                ports.add(int(remote.rsplit(":", 1)[1], 16))
    return ports


@dataclass
class Faults:
    """What the faults act on, and the log of what they did."""

    gateway: Gateway
    load: Load
    upstream: subprocess.Popen
    redis_port: int
    database_url: str
    log: list[str] = field(default_factory=list)
    last_done_at: float = 0.0
    # When connections were terminated under load: (began, ended), monotonic.
    open_terminations: list[tuple[float, float]] = field(default_factory=list)

    def run(self, schedule: list[Fault], started: float) -> None:
        """Do each fault at its time (or as soon as the one before it is done)."""
        actions: dict[str, Callable[[], str]] = {
            KILL: self.kill_worker,
            PAUSE_REDIS: self.pause_redis,
            STOP_UPSTREAM: self.stop_upstream,
            RESTART: self.restart,
            TERMINATE_OPEN: self.terminate,
            TERMINATE_QUIET: self.terminate_quietly,
        }
        for fault in schedule:
            wait = started + fault.at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            began = time.monotonic() - started
            what = actions[fault.kind]()
            self.last_done_at = time.monotonic()
            self.log.append(f"{began:6.2f}s {fault.kind} (scheduled {fault.at}s): {what}")

    def kill_worker(self) -> str:
        """SIGKILL the worker serving the most long streams (waiting a little for some)."""
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while time.monotonic() < deadline and len(self.load.long_streams(LONG_STREAM_SECONDS)) < 2:
            time.sleep(0.05)
        ports = {a.client_port for a in self.load.long_streams(LONG_STREAM_SECONDS)}
        served = {
            pid: len(ports & connected_client_ports(pid, self.gateway.port))
            for pid in self.gateway.workers()
        }
        victim = max(served, key=lambda pid: served[pid])
        os.kill(victim, signal.SIGKILL)
        return f"killed worker {victim}, serving {served[victim]} of {len(ports)} long streams"

    def pause_redis(self) -> str:
        """Make Redis answer no client for a while."""
        answer = redis_cli(self.redis_port, "CLIENT", "PAUSE", str(REDIS_PAUSE_MS))
        return f"CLIENT PAUSE {REDIS_PAUSE_MS}: {answer}"

    def stop_upstream(self) -> str:
        """Stop the upstream process, then let it go on."""
        os.kill(self.upstream.pid, signal.SIGSTOP)
        try:
            time.sleep(UPSTREAM_STOP_SECONDS)
        finally:
            os.kill(self.upstream.pid, signal.SIGCONT)
        return f"upstream stopped for {UPSTREAM_STOP_SECONDS}s"

    def restart(self) -> str:
        """Restart the gunicorn master on the same port."""
        began = time.monotonic()
        self.gateway.restart()
        return f"master restarted in {time.monotonic() - began:.1f}s"

    def terminate(self) -> str:
        """End every server connection of the gateway, in use or idle."""
        began = time.monotonic()
        terminated = terminate_backends(self.database_url)
        self.open_terminations.append((began, time.monotonic()))
        return f"terminated {terminated} connections"

    def terminate_quietly(self) -> str:
        """Hold new requests back, end the connections, let the streams in flight settle."""
        deadline = time.monotonic() + KILL_WAIT_SECONDS
        while time.monotonic() < deadline and self.load.streams_in_flight() < 2:
            time.sleep(0.05)
        self.load.admit.clear()
        try:
            # Requests admitted just before have placed their holds by then.
            time.sleep(0.3)
            in_flight = self.load.streams_in_flight()
            terminated = terminate_backends(self.database_url)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline and self.load.streams_in_flight():
                time.sleep(0.05)
        finally:
            self.load.admit.set()
        return f"terminated {terminated} connections with {in_flight} streams in flight"


def terminate_backends(database_url: str) -> int:
    """End the server connections to the run's database but this one; wait until gone."""
    engine = sqlalchemy.create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            pids = list(connection.execute(OTHER_BACKENDS).scalars())
            # A query of its own: in one statement, nothing says which condition runs first.
            connection.execute(TERMINATE, {"pids": pids})
            # The server ends them asynchronously; new ones may open meanwhile.
            deadline = time.monotonic() + 5
            while (
                time.monotonic() < deadline and connection.execute(ALIVE, {"pids": pids}).scalar()
            ):
                time.sleep(0.01)
    finally:
        engine.dispose()
    return len(pids)


OTHER_BACKENDS = sqlalchemy.text(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)
# Typed: an empty list says nothing of its elements' type.
TERMINATE = sqlalchemy.text(
    "SELECT pg_terminate_backend(pid) FROM unnest(CAST(:pids AS integer[])) AS pid"
)
ALIVE = sqlalchemy.text(
    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(CAST(:pids AS integer[]))"
)
