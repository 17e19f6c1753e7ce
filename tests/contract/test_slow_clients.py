"""Callers that send their body slowly hold nothing that other requests need."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from urllib.parse import urlsplit

import requests

# More than the database pool holds (ten connections and ten for bursts, per worker).
SLOW_CALLERS = 30
HELLO = {"model": "dev-chat-mini", "messages": [{"role": "user", "content": "hello"}]}


@contextmanager
def callers_stuck_in_their_body(url: str, key: str, count: int) -> Iterator[None]:
    """Open ``count`` requests that send their headers and half of their body, then wait."""
    address = urlsplit(url)
    body = b'{"model":"dev-chat-mini","messages":[{"role":"user","content":"hello"}]}'
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\n"
        f"Host: {address.netloc}\r\n"
        f"Authorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with ExitStack() as stack:
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection((address.hostname, address.port)))
            sock.sendall(head + body[: len(body) // 2])
        yield


def test_callers_slow_to_send_their_body_do_not_hold_the_database(live_server, make_funded_key):
    slow, quick = make_funded_key(), make_funded_key()
    headers = {"Authorization": f"Bearer {quick.key}"}

    with callers_stuck_in_their_body(live_server.url, slow.key, SLOW_CALLERS):
        # A pooled connection held by each waiting caller would leave this one waiting
        # for the pool's timeout (30 s), and failing.
        answer = requests.post(
            f"{live_server.url}/v1/chat/completions", json=HELLO, headers=headers, timeout=10
        )

    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"]
