"""A webhook receiver for tests: it checks each delivery's signature and keeps its events."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def verify(secret: str, header: str, body: bytes) -> bool:
    """Check a Gateway-Signature header as a receiver would, from its documented form."""
    parts = dict(item.split("=", 1) for item in header.split(","))
    expected = hmac.new(
        secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256
    ).hexdigest()
    return hmac.compare_digest(expected, parts["v1"])


@dataclass
class Receiver:
    """What the receiver got; the statuses it answers with, in turn (then 200)."""

    url: str
    secret: str = ""
    answers: list[int] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    bad_signatures: int = 0
    posts: int = 0
    # The signature time (``t=``) of each POST, in the order they came.
    signed_at: list[int] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)


@contextmanager
def webhook_receiver(
    answers: list[int] | None = None, before_answer: Callable[[], None] | None = None
) -> Iterator[Receiver]:
    """Serve a receiver on a free port; set its ``secret`` once the endpoint is made.

    ``before_answer`` runs on each POST before it is answered: a slow receiver's wait.
    """
    receiver = Receiver(url="", answers=list(answers or []))
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the standard library's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if before_answer is not None:
                before_answer()
            with lock:
                receiver.posts += 1
                header = dict(
                    item.split("=", 1) for item in self.headers["Gateway-Signature"].split(",")
                )
                receiver.signed_at.append(int(header["t"]))
                receiver.authorizations.append(self.headers.get("Authorization"))
                status = receiver.answers.pop(0) if receiver.answers else 200
                if verify(receiver.secret, self.headers["Gateway-Signature"], body):
                    if status == 200:
                        receiver.events.append(json.loads(body))
                else:
                    receiver.bad_signatures += 1
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            """Keep the test's output quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/gateway"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def trickling_receiver(seconds: float = 20) -> Iterator[str]:
    """Serve a receiver that answers a byte of its head every 0.2 s for ``seconds``; yield its URL.

    Each byte comes well within a read timeout: only a deadline on the whole try ends it.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        with contextlib.suppress(OSError):
            connection, _ = listener.accept()
            with connection:
                connection.recv(65_536)
                head = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"." * int(seconds / 0.2)
                for byte in head:
                    if stop.wait(0.2):
                        return
                    connection.sendall(bytes([byte]))

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hooks/gateway"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=5)
