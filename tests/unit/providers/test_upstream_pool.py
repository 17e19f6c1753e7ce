"""UpstreamPool: kept-alive connections per upstream, a request in one write, stale ones dropped."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from app.providers.base import ChatRequest, RouteTarget, UpstreamConfig
from app.providers.http1 import UpstreamPool, decoder_of, readable_now
from app.providers.openai_compat import OpenAICompatAdapter
from app.providers.transport import open_pool, prepared_url
from tests.upstream_server import Reply

TIMEOUT = (5.0, 5.0)
HELLO = [{"role": "user", "content": "Hello"}]


class Recorder(BaseHTTPRequestHandler):
    """Answers every POST with JSON and a cookie; records each request's line, peer and body."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, int]]
    bodies: list[bytes]
    # Whether to close each connection after its answer, without saying so in a header.
    hang_up = False

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, self.client_address[1]))
        body = b'{"ok": true}'
        self.send_response(201, "Made")
        self.send_header("Content-Type", "application/json; charset=latin-1")
        self.send_header("Set-Cookie", "session=abc; Path=/")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.hang_up

    def log_message(self, *args: object) -> None:
        """Keep the test output quiet."""


class Server(ThreadingHTTPServer):
    """Counts the connections it has closed."""

    def __init__(self, handler: type[Recorder]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.closed = threading.Semaphore(0)

    def shutdown_request(self, request: socket.socket) -> None:
        super().shutdown_request(request)
        self.closed.release()


def serve(
    tls: ssl.SSLContext | None = None, **options: object
) -> Iterator[tuple[str, list[tuple[str, int]], Server]]:
    seen: list[tuple[str, int]] = []
    handler = type("Handler", (Recorder,), {"seen": seen, "bodies": [], **options})
    httpd = Server(handler)
    scheme = "http"
    if tls is not None:
        httpd.socket = tls.wrap_socket(httpd.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"{scheme}://127.0.0.1:{httpd.server_address[1]}", seen, httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """A local JSON API; yields its base URL and the (path, client port) of each request."""
    for base, seen, _ in serve():
        yield base, seen


@pytest.fixture
def hanging_up_server() -> Iterator[tuple[str, list[tuple[str, int]], Server]]:
    """The same API closing each connection after its answer, as an idle timeout would."""
    yield from serve(hang_up=True)


@pytest.fixture
def certificate(tmp_path: Path) -> Path:
    """A self-signed certificate for 127.0.0.1, its key in the same file."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    pem = tmp_path / "server.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(pem), "-out", str(pem)],
        check=True, capture_output=True,
    )  # fmt: skip
    return pem


@pytest.fixture
def tls_server(certificate: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """The JSON API over TLS, with a certificate no public CA signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate)
    for base, seen, _ in serve(tls=context):
        yield base, seen


def post(pool: UpstreamPool, url: str, body: bytes = b"{}") -> tuple[int, dict[str, str], bytes]:
    response = pool.post(prepared_url(url), body, {"Content-Type": "application/json"}, TIMEOUT)
    return response.status, response.headers, response.read()


def test_a_response_carries_what_requests_reads_of_it(server) -> None:
    base, _ = server
    status, headers, content = post(open_pool(4), f"{base}/v1/chat")
    reference = requests.post(f"{base}/v1/chat", data=b"{}", timeout=5)

    assert status == reference.status_code == 201
    assert headers == {name.lower(): value for name, value in reference.headers.items()}
    assert content == reference.content == b'{"ok": true}'
    assert headers["set-cookie"] == "session=abc; Path=/"
    assert reference.cookies.get("session") == "abc"


def test_the_request_line_names_the_path_and_query(server) -> None:
    base, seen = server
    pool = open_pool(4)

    post(pool, f"{base}/v1/chat?api-version=2")
    post(pool, f"{base}/other")

    assert [path for path, _ in seen] == ["/v1/chat?api-version=2", "/other"]


def test_calls_share_one_kept_alive_connection(server) -> None:
    base, seen = server
    pool = open_pool(4)

    for _ in range(3):
        post(pool, f"{base}/v1/chat")

    assert len({port for _, port in seen}) == 1
    assert (pool.connections_opened, pool.idle_connections) == (1, 1)


def test_a_closed_pool_opens_new_connections(server) -> None:
    base, seen = server
    pool = open_pool(4)
    post(pool, f"{base}/v1/chat")

    pool.close()

    assert post(pool, f"{base}/v1/chat")[0] == 201
    assert len({port for _, port in seen}) == 2


def test_a_connection_the_upstream_closed_is_not_reused(hanging_up_server) -> None:
    base, seen, httpd = hanging_up_server
    pool = open_pool(4)
    post(pool, f"{base}/v1/chat")
    assert httpd.closed.acquire(timeout=5)

    again = post(pool, f"{base}/v1/chat")

    assert again[0] == 201
    assert len({port for _, port in seen}) == 2


def test_no_more_than_pool_size_connections_are_kept(server) -> None:
    base, seen = server
    pool = open_pool(1)
    url = prepared_url(f"{base}/v1/chat")
    held = [pool.post(url, b"{}", {}, TIMEOUT) for _ in range(2)]

    for response in held:
        response.read()

    assert pool.idle_connections == 1
    assert len({port for _, port in seen}) == 2


def test_readable_now_tells_data_and_a_close_from_nothing() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        assert not readable_now(ours)
        theirs.sendall(b"x")
        assert readable_now(ours)
        ours.recv(1)
        assert not readable_now(ours)
        theirs.close()
        assert readable_now(ours)


class WriteRecorder:
    """A socket that records each write it is given, then makes it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.writes: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.sock.sendall(data)

    def send(self, data: bytes) -> int:
        self.writes.append(bytes(data))
        return self.sock.send(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def recorded_pool(base: str) -> tuple[UpstreamPool, WriteRecorder]:
    """Return a pool holding one kept-alive connection to ``base``, its writes recorded."""
    pool = open_pool(4)
    post(pool, f"{base}/v1/chat")
    (origin,) = pool.origins.values()
    (connection,) = origin.idle
    recorder = WriteRecorder(connection.sock)
    connection.sock = recorder  # type: ignore[assignment]
    return pool, recorder


def test_a_request_and_its_body_go_out_in_one_write(server) -> None:
    base, seen = server
    pool, recorder = recorded_pool(base)
    body = b'{"model": "m", "messages": []}'

    for _ in range(2):
        assert post(pool, f"{base}/v1/chat", body)[2] == b'{"ok": true}'

    assert len(recorder.writes) == 2
    for write in recorder.writes:
        assert write.startswith(b"POST /v1/chat HTTP/1.1\r\n")
        assert write.endswith(b"\r\n\r\n" + body)
    assert [path for path, _ in seen] == ["/v1/chat", "/v1/chat", "/v1/chat"]


def test_a_large_body_goes_out_in_one_write_too(server) -> None:
    base, seen = server
    pool, recorder = recorded_pool(base)
    body = b'{"messages": "%s"}' % (b"x" * 300_000)

    assert post(pool, f"{base}/v1/chat", body)[2] == b'{"ok": true}'

    (write,) = recorder.writes
    assert write.startswith(b"POST /v1/chat HTTP/1.1\r\n")
    assert write.endswith(b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert [path for path, _ in seen] == ["/v1/chat", "/v1/chat"]


def test_a_header_that_would_break_the_head_is_refused_before_anything_is_sent(server) -> None:
    base, seen = server
    pool, recorder = recorded_pool(base)
    url = prepared_url(f"{base}/v1/chat")

    for name, value in (("X-Key", "k\r\nX-Injected: 1"), ("X-Key", "k\n"), ("X Key", "k")):
        with pytest.raises(ValueError):
            pool.post(url, b"{}", {name: value}, TIMEOUT)

    assert recorder.writes == []
    assert len(seen) == 1


def test_an_upstream_whose_certificate_is_not_trusted_is_refused(tls_server) -> None:
    base, seen = tls_server

    with pytest.raises(ssl.SSLCertVerificationError):
        post(open_pool(4), f"{base}/v1/chat")

    assert seen == []


def test_calls_over_tls_are_answered_on_one_kept_alive_connection(
    tls_server, certificate, monkeypatch
) -> None:
    base, seen = tls_server
    monkeypatch.setattr(requests.certs, "where", lambda: str(certificate))
    pool = open_pool(4)

    answers = [post(pool, f"{base}/v1/chat") for _ in range(3)]

    assert {(status, content) for status, _, content in answers} == {(201, b'{"ok": true}')}
    assert len({port for _, port in seen}) == 1
    assert pool.connections_opened == 1


def test_an_adapter_asks_only_for_the_encodings_its_reads_decode(replay_server) -> None:
    adapter = OpenAICompatAdapter(
        UpstreamConfig(name="own", kind="openai", base_url=f"{replay_server.url}/own/v1")
    )
    replay_server.script("/own", Reply("openai_chat"))

    adapter.complete(ChatRequest(model="mini", messages=HELLO), RouteTarget(upstream_model="m"))

    (exchange,) = replay_server.exchanges
    codings = exchange.headers["accept-encoding"].split(", ")
    assert codings == ["gzip", "deflate"]
    assert all(decoder_of(coding) is not None for coding in codings)
