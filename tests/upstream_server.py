"""A local upstream for tests: replays recorded HTTP transcripts byte for byte, with faults.

A transcript (``tests/fixtures/transcripts/*.http``) is an HTTP/1.1 response as it came
off the wire: status line, headers, blank line, body. When its headers say
``transfer-encoding: chunked`` the file holds the body de-chunked, and the server sends
every event (every block ending in a blank line) as one HTTP chunk, as streaming servers
flush per event; a ``content-length`` is recomputed from the body. ``Reply`` options cut
writes smaller (events split across TCP segments), pause between them, die mid-stream,
hang, or repeat an event until the client goes away.

Each request is answered by the next reply scripted for the longest path prefix it
matches (``/own`` for a base_url of ``http://127.0.0.1:PORT/own/v1``). The server records
every request (``Exchange``) and the moment the client closed its connection mid-answer.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

from app.providers.base import Chunk

TRANSCRIPTS = Path(__file__).parent / "fixtures" / "transcripts"
EVENT_END = re.compile(rb"(?<=\r\n\r\n)|(?<=\n\n)|(?<=\r\r)")
MAX_REPEAT_SECONDS = 30.0
UNSCRIPTED = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
    b"content-length: 62\r\n\r\n"
    b'{"error": {"message": "replay server: no reply was scripted"}}'
)


@dataclass(frozen=True)
class Reply:
    """How to answer one request.

    ``transcript`` names a file in tests/fixtures/transcripts (without ``.http``);
    ``write_size`` cuts every write into pieces of that many bytes; ``pause`` is the
    sleep between writes; ``close_after_events`` drops the connection after that many
    events; ``stall_after_events`` goes silent after that many for ``stall_seconds``
    (by default until the client gives up); ``together`` sends the head and the events
    before the stall in one write, and the rest in another (an upstream faster than its
    reader); ``hang`` never answers at all; ``repeat_event`` sends events up to that
    index, then repeats it every ``pause`` until the client closes the connection;
    ``pauses`` holds (index, seconds) pairs: a wait before sending that event.
    """

    transcript: str | None = None
    write_size: int | None = None
    pause: float = 0.0
    close_after_events: int | None = None
    stall_after_events: int | None = None
    stall_seconds: float = math.inf
    together: bool = False
    hang: bool = False
    repeat_event: int | None = None
    pauses: tuple[tuple[int, float], ...] = ()


@dataclass
class Exchange:
    """One request the server received, and how the client left."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int
    received_at: float = field(default_factory=time.monotonic)
    client_closed_at: float | None = None
    answered: threading.Event = field(default_factory=threading.Event)

    @property
    def json(self) -> Any:
        """The request body, decoded."""
        return json.loads(self.body)


@cache
def load_transcript(name: str) -> tuple[bytes, bytes]:
    """Return a transcript's head (status line and headers, CRLF-terminated) and body."""
    raw = (TRANSCRIPTS / f"{name}.http").read_bytes()
    head, separator, body = raw.partition(b"\r\n\r\n")
    assert separator, f"{name}.http: the head must end with a blank CRLF line"
    return head + b"\r\n", body


def split_events(body: bytes) -> list[bytes]:
    """Cut an event-stream body after every blank line (LF, CRLF or CR line ends)."""
    return [piece for piece in EVENT_END.split(body) if piece]


def response_pieces(name: str) -> tuple[bytes, list[bytes]]:
    """Return what to send for a transcript: its head, then its body in pieces."""
    head, body = load_transcript(name)
    if b"\r\ntransfer-encoding: chunked\r\n" in head.lower():
        pieces = [b"%x\r\n%s\r\n" % (len(event), event) for event in split_events(body)]
        return head + b"\r\n", pieces + [b"0\r\n\r\n"]
    head = re.sub(rb"(?im)^content-length: *\d+", b"content-length: %d" % len(body), head)
    return head + b"\r\n", [body]


def answered_chunks(stream: Iterable[Chunk]) -> list[Chunk]:
    """Return the chunks of an adapter's stream that carry an answer: choices or usage.

    Left out are those that only mark where an upstream read ended, which depends on how
    the network cut the replayed bytes.
    """
    return [chunk for chunk in stream if chunk.choices or chunk.usage is not None]


def closed_port() -> int:
    """Return a local port nothing listens on (connections to it are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PeerClosed(Exception):
    """The client closed the connection."""


class ReplayServer:
    """The server: a listening socket and one thread per connection, keep-alive included."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        # accept() wakes up now and then to see whether the server was closed.
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.exchanges: list[Exchange] = []
        self._scripts: dict[str, deque[Reply]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._connections = itertools.count(1)
        threading.Thread(target=self._accept, daemon=True).start()

    def script(self, prefix: str, *replies: Reply) -> None:
        """Answer the next requests under ``prefix`` with ``replies``, in order."""
        with self._lock:
            self._scripts.setdefault(prefix, deque()).extend(replies)

    def reset(self) -> None:
        """Forget the scripts and the exchanges."""
        with self._lock:
            self._scripts.clear()
            self.exchanges.clear()

    def exchanges_to(self, prefix: str) -> list[Exchange]:
        """The requests received under ``prefix``, oldest first."""
        with self._lock:
            return [e for e in self.exchanges if e.path.startswith(prefix)]

    def unused_replies(self) -> dict[str, int]:
        """How many scripted replies are still waiting, per prefix that has any."""
        with self._lock:
            return {prefix: len(queue) for prefix, queue in self._scripts.items() if queue}

    def close(self) -> None:
        """Stop accepting, and end every connection still open."""
        self._stopping.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            connection.settimeout(None)
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _next_reply(self, path: str) -> Reply | None:
        with self._lock:
            for prefix in sorted(self._scripts, key=len, reverse=True):
                if path.startswith(prefix) and self._scripts[prefix]:
                    return self._scripts[prefix].popleft()
        return None

    def _serve(self, connection: socket.socket) -> None:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = connection.makefile("rb")
        number = next(self._connections)
        try:
            while exchange := read_request(reader, number):
                with self._lock:
                    self.exchanges.append(exchange)
                try:
                    keep_alive = self._answer(connection, exchange, self._next_reply(exchange.path))
                finally:
                    exchange.answered.set()
                if not keep_alive:
                    return
        except (PeerClosed, OSError):
            return
        finally:
            reader.close()
            connection.close()

    def _answer(self, connection: socket.socket, exchange: Exchange, reply: Reply | None) -> bool:
        """Send ``reply``; return whether the connection may serve another request."""
        if reply is None:
            connection.sendall(UNSCRIPTED)
            return True
        writer = Writer(connection, exchange, reply, self._stopping)
        if reply.hang:
            writer.wait(float("inf"))
            return False
        head, pieces = response_pieces(reply.transcript or "")
        keep_alive = b"\r\nconnection: close\r\n" not in head.lower()
        if reply.together:
            writer.send_together(head, pieces)
            return keep_alive
        writer.send(head)
        pauses = dict(reply.pauses)
        for index, piece in enumerate(pieces):
            writer.wait(pauses.get(index, 0.0))
            if index == reply.close_after_events:
                connection.shutdown(socket.SHUT_RDWR)
                return False
            if index == reply.stall_after_events:
                writer.wait(reply.stall_seconds)
            writer.send(piece)
            if index == reply.repeat_event:
                writer.repeat(piece)
                return False
        return keep_alive


class Writer:
    """Sends one reply: cut and paced as asked, watching for the client going away."""

    def __init__(
        self,
        connection: socket.socket,
        exchange: Exchange,
        reply: Reply,
        stopping: threading.Event,
    ) -> None:
        self.connection = connection
        self.exchange = exchange
        self.reply = reply
        self.stopping = stopping

    def send(self, data: bytes) -> None:
        """Write ``data`` in pieces of ``write_size``, pausing before each."""
        size = self.reply.write_size or len(data)
        for start in range(0, len(data), size):
            self.wait(self.reply.pause)
            try:
                self.connection.sendall(data[start : start + size])
            except OSError:
                self._closed()

    def send_together(self, head: bytes, pieces: list[bytes]) -> None:
        """Write the head and the pieces before the stall at once, then the rest at once."""
        stall = self.reply.stall_after_events
        stall = len(pieces) if stall is None else stall
        self.send(head + b"".join(pieces[:stall]))
        if rest := b"".join(pieces[stall:]):
            self.wait(self.reply.stall_seconds)
            self.send(rest)

    def repeat(self, piece: bytes) -> None:
        """Send ``piece`` again and again until the client leaves (or 30 s pass)."""
        deadline = time.monotonic() + MAX_REPEAT_SECONDS
        while time.monotonic() < deadline:
            self.send(piece)
        raise PeerClosed

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, noticing at once when the client closes the connection."""
        deadline = time.monotonic() + seconds
        while not self.stopping.is_set():
            left = min(deadline - time.monotonic(), 0.05)
            readable, _, _ = select.select([self.connection], [], [], max(left, 0))
            if readable and not self._peek():
                self._closed()
            if time.monotonic() >= deadline:
                return
        raise PeerClosed

    def _peek(self) -> bytes:
        try:
            return self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return b""

    def _closed(self) -> None:
        if self.exchange.client_closed_at is None:
            self.exchange.client_closed_at = time.monotonic()
        raise PeerClosed


def read_request(reader: BinaryIO, connection: int) -> Exchange | None:
    """Read one request (head and Content-Length body); None when the client closed."""
    line = reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0")))
    return Exchange(method=method, path=path, headers=headers, body=body, connection=connection)
