"""gunicorn's workers each accept on a socket of their own, so a burst is spread over them."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from tests.conftest import running_server

LISTEN, ESTABLISHED = "0A", "01"
BURST = 32


def worker_pids(master_pid: int) -> list[int]:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return [int(pid) for pid in children]


def sockets_of(pid: int, port: int, state: str) -> set[int]:
    """Return the inodes of ``pid``'s TCP sockets on local ``port`` in ``state``."""
    owned = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            owned.add(int(target[8:-1]))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            inode = int(fields[9])
            if local_port == port and fields[3] == state and inode in owned:
                found.add(inode)
    return found


def listening_sockets(master_pid: int, port: int, workers: int) -> dict[int, set[int]]:
    """Wait for ``workers`` workers to listen on ``port``; return each one's sockets."""
    deadline = time.monotonic() + 30
    while True:
        pids = worker_pids(master_pid)
        listening = {pid: sockets_of(pid, port, LISTEN) for pid in pids}
        if len(pids) == workers and all(listening.values()) or time.monotonic() > deadline:
            return listening
        time.sleep(0.1)


def open_burst(port: int) -> list[socket.socket]:
    """Open BURST keep-alive connections at once; send each a request; keep them open."""
    connections = [socket.create_connection(("127.0.0.1", port)) for _ in range(BURST)]
    for connection in connections:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
    for connection in connections:
        connection.settimeout(10)
        assert connection.recv(65536).startswith(b"HTTP/1.1 200")
    return connections


def test_each_worker_accepts_on_its_own_socket_and_a_burst_is_spread(database_url, tmp_path):
    with running_server(database_url, tmp_path, WEB_CONCURRENCY="2") as server:
        port = int(server.url.rsplit(":", 1)[1])
        listening = listening_sockets(server.process.pid, port, workers=2)
        connections = open_burst(port)
        try:
            held = {pid: len(sockets_of(pid, port, ESTABLISHED)) for pid in listening}
        finally:
            for connection in connections:
                connection.close()

    first, second = listening.values()
    assert first and second and not first & second, "the workers share one listening socket"
    assert sum(held.values()) == BURST
    # The kernel spreads connections by their addresses: an even split is likeliest, and
    # fewer than 4 of 32 on one worker happens about once in 400,000 bursts.
    assert min(held.values()) >= 4, held
