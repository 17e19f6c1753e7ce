"""UpstreamPool: requests' transport adapter with each URL's pool and path found once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from requests.adapters import HTTPAdapter

from app.providers.transport import open_pool, prepared_post, prepared_url


class Recorder(BaseHTTPRequestHandler):
    """Answers every POST with JSON and a cookie; records each request's line and peer."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, int]]

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

    def log_message(self, *args: object) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def server() -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """A local JSON API; yields its base URL and the (path, client port) of each request."""
    seen: list[tuple[str, int]] = []
    handler = type("Handler", (Recorder,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    httpd.shutdown()
    httpd.server_close()


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
