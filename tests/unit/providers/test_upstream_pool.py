"""UpstreamPool: requests' transport adapter with each URL's pool and path found once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from requests.adapters import HTTPAdapter

from app.providers.transport import (
    UpstreamHTTPConnection,
    open_pool,
    prepared_post,
    prepared_url,
    readable_now,
)


class Recorder(BaseHTTPRequestHandler):
    """Answers every POST with JSON and a cookie; records each request's line and peer."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, int]]
    # Whether to close each connection after its answer, without saying so in a header.
    hang_up = False

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.rfile.read(int(self.headers["Content-Length"]))
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


def serve(**options: object) -> Iterator[tuple[str, list[tuple[str, int]], Server]]:
    seen: list[tuple[str, int]] = []
    httpd = Server(type("Handler", (Recorder,), {"seen": seen, **options}))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen, httpd
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


def post(adapter: HTTPAdapter, url: str) -> requests.Response:
    response = adapter.send(prepared_post(prepared_url(url), b"{}", {}), timeout=5)
    response.content  # noqa: B018 - reads the body, giving the connection back
    return response


def test_a_response_is_what_requests_builds_but_its_cookies(server) -> None:
    base, _ = server
    ours, theirs = open_pool(4), HTTPAdapter()
    mine, reference = post(ours, f"{base}/v1/chat"), post(theirs, f"{base}/v1/chat")

    for field in ("status_code", "reason", "encoding", "url", "content"):
        assert getattr(mine, field) == getattr(reference, field), field
    assert dict(mine.headers) == dict(reference.headers)
    assert mine.json() == {"ok": True}
    assert mine.request.url == f"{base}/v1/chat"
    assert mine.connection is ours
    assert reference.cookies.get("session") == "abc"
    assert not mine.cookies


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


def test_a_closed_adapter_opens_new_pools(server) -> None:
    base, seen = server
    pool = open_pool(4)
    post(pool, f"{base}/v1/chat")

    pool.close()

    assert post(pool, f"{base}/v1/chat").status_code == 201
    assert len({port for _, port in seen}) == 2


def test_a_connection_the_upstream_closed_is_not_reused(hanging_up_server) -> None:
    base, seen, httpd = hanging_up_server
    pool = open_pool(4)
    post(pool, f"{base}/v1/chat")
    assert httpd.closed.acquire(timeout=5)

    again = post(pool, f"{base}/v1/chat")

    assert again.status_code == 201
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

    def __getattr__(self, name: str) -> object:
        return getattr(self.sock, name)


def recorded_connection(base: str) -> tuple[UpstreamHTTPConnection, WriteRecorder]:
    host, port = base.removeprefix("http://").split(":")
    connection = UpstreamHTTPConnection(host, int(port), timeout=5)
    connection.connect()
    recorder = WriteRecorder(connection.sock)
    connection.sock = recorder  # type: ignore[assignment]
    return connection, recorder


def test_a_request_and_its_body_go_out_in_one_write(server) -> None:
    base, seen = server
    connection, recorder = recorded_connection(base)
    body = b'{"model": "m", "messages": []}'

    for _ in range(2):
        connection.request(
            "POST", "/v1/chat", body=body, headers={"Content-Length": str(len(body))}
        )
        assert connection.getresponse().data == b'{"ok": true}'

    assert len(recorder.writes) == 2
    for write in recorder.writes:
        assert write.startswith(b"POST /v1/chat HTTP/1.1\r\n")
        assert write.endswith(b"\r\n\r\n" + body)
    assert [path for path, _ in seen] == ["/v1/chat", "/v1/chat"]


def test_a_body_given_in_pieces_is_written_as_urllib3_writes_it(server) -> None:
    base, seen = server
    connection, recorder = recorded_connection(base)
    pieces, whole = [b'{"model": ', b'"m"}'], b'{"model": "m"}'

    for body in (iter(pieces), whole):
        connection.request("POST", "/v1/chat", body=body, headers={"Content-Length": "14"})
        assert connection.getresponse().data == b'{"ok": true}'

    assert recorder.writes[0].endswith(b"\r\n\r\n")
    assert recorder.writes[1:3] == pieces
    assert len(recorder.writes) == 4 and recorder.writes[3].endswith(b"\r\n\r\n" + whole)
    assert [path for path, _ in seen] == ["/v1/chat", "/v1/chat"]
