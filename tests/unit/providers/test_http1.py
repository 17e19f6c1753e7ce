"""Reading an upstream's answer off its socket: the head, the body's framing, its encoding."""

from __future__ import annotations

import gzip
import http.client
import zlib

import pytest

from app.providers.http1 import (
    MAX_HEADERS,
    Origin,
    UpstreamPool,
    UpstreamResponse,
    header_lines,
    normalized_url,
    receive,
)

GZIPPED_OK = gzip.compress(b"ok", mtime=0)
TOO_MANY_HEADERS = b"X: y\r\n" * (MAX_HEADERS + 1)


class GivenReads:
    """A socket whose reads bring the given pieces, one each, then the peer's close."""

    def __init__(self, *reads: bytes) -> None:
        self.reads = [read for read in reads if read]

    def recv(self, size: int) -> bytes:
        return self.reads.pop(0) if self.reads else b""


class Connection:
    """Stands for a pooled connection: tells whether it was closed."""

    sock = None
    closed = False

    def close(self) -> None:
        self.closed = True


def answer(*reads: bytes) -> tuple[UpstreamResponse, Origin, Connection]:
    """Return the response read off ``reads``, with the origin and connection it came on."""
    origin, connection = Origin("http", "127.0.0.1", 80, 4), Connection()
    response = receive(GivenReads(*reads), origin, connection)  # type: ignore[arg-type]
    return response, origin, connection


def test_the_head_gives_the_status_and_headers_lower_cased_repeats_joined():
    response, _, _ = answer(
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nX-Tag: a\r\n"
        b"x-tag: b\r\nX-Folded: one\r\n two\r\nnot a header\r\nContent-Length: 0\r\n\r\n"
    )

    assert response.status == 429
    assert response.headers == {
        "retry-after": "2",
        "x-tag": "a, b",
        "x-folded": "one two",
        "content-length": "0",
    }


def test_a_head_cut_across_reads_or_ending_its_lines_in_lf_alone_is_read():
    response, _, _ = answer(b"HTTP/1.1 200 OK\nContent-Le", b"ngth: 2\n", b"\nok")

    assert (response.status, response.read()) == (200, b"ok")


def test_interim_answers_are_skipped_for_the_final_one():
    response, _, _ = answer(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    )

    assert (response.status, response.headers, response.read()) == (
        200,
        {"content-length": "2"},
        b"ok",
    )


@pytest.mark.parametrize(
    ("reads", "error"),
    [
        ([b""], http.client.RemoteDisconnected),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"], http.client.RemoteDisconnected),
        ([b"ICY 200 OK\r\n\r\n"], http.client.BadStatusLine),
        ([b"HTTP/1.1 2000 OK\r\n\r\n"], http.client.BadStatusLine),
        ([b"HTTP/1.1 099 Early\r\n\r\n"], http.client.BadStatusLine),
        ([b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000], http.client.LineTooLong),
        ([b"HTTP/1.1 200 OK\r\n" + TOO_MANY_HEADERS + b"\r\n"], http.client.HTTPException),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\nok"], http.client.HTTPException),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\n"], http.client.HTTPException),
        ([b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\n\r\n"], http.client.HTTPException),
    ],
)  # fmt: skip
def test_a_malformed_or_missing_head_fails_as_http_clients_would(reads, error):
    with pytest.raises(error) as caught:
        answer(*reads)

    assert type(caught.value) is error


def test_a_length_body_read_whole_gives_its_connection_back():
    response, origin, connection = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe", b"llo")

    assert response.read() == b"hello"
    assert response.ended
    assert origin.idle == [connection] and not connection.closed


def test_a_repeated_equal_content_length_is_one_length():
    response, _, _ = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok")

    assert response.read() == b"ok"


@pytest.mark.parametrize(
    "head",
    [
        # Bytes past the body's end: the connection is out of step.
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok!",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        # HTTP/1.0 keeps a connection only when it says so.
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        # No length: the body ends where the connection does.
        b"HTTP/1.1 200 OK\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n" + GZIPPED_OK,
    ],
)
def test_a_connection_that_cannot_serve_another_request_is_closed(head):
    response, origin, connection = answer(head)

    assert response.read() in (b"ok", GZIPPED_OK)
    assert origin.idle == [] and connection.closed


def test_an_http_1_0_answer_keeping_alive_gives_its_connection_back():
    response, origin, connection = answer(
        b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok"
    )

    assert response.read() == b"ok"
    assert origin.idle == [connection]


def test_a_body_cut_short_of_its_length_fails_and_is_not_kept():
    response, origin, connection = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe")

    with pytest.raises(http.client.IncompleteRead):
        response.read()
    assert origin.idle == [] and connection.closed


@pytest.mark.parametrize("status", [204, 304])
def test_an_answer_without_a_body_ends_with_its_head(status):
    response, origin, connection = answer(b"HTTP/1.1 %d No\r\nContent-Length: 9\r\n\r\n" % status)

    assert response.ended
    assert response.read() == b""
    assert origin.idle == [connection]


def test_bytes_past_a_body_that_ended_with_its_head_close_the_connection():
    response, origin, connection = answer(b"HTTP/1.1 204 No Content\r\n\r\nstray")

    assert response.read() == b""
    assert origin.idle == [] and connection.closed


ENCODED = [
    gzip.compress(b"hello, world", mtime=0),
    gzip.compress(b"hello, ", mtime=0) + gzip.compress(b"world", mtime=0),
    zlib.compress(b"hello, world"),
    zlib.compress(b"hello, world")[2:-4],  # deflate sent raw, as some servers do
]


@pytest.mark.parametrize(
    "encoded", ENCODED, ids=["gzip", "gzip in two members", "deflate", "raw deflate"]
)
@pytest.mark.parametrize("read_size", [7, 6], ids=["reads cut anywhere", "a byte a read"])
def test_an_encoded_body_is_decoded_as_its_reads_come(encoded, read_size):
    coding = b"gzip" if encoded[:2] == b"\x1f\x8b" else b"deflate"
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % coding
    # One byte a chunk: six bytes framed, so that reads of six bring one byte of data each.
    framed = b"".join(b"1\r\n%s\r\n" % encoded[i : i + 1] for i in range(len(encoded)))
    reads = [framed[i : i + read_size] for i in range(0, len(framed), read_size)]
    response, _, _ = answer(head, *reads, b"0\r\n\r\n")

    items = []
    while not response.ended:
        items.append(response.read1())

    assert b"".join(items) == b"hello, world"
    assert len(items) > 3


def test_a_corrupt_encoded_body_fails():
    response, origin, _ = answer(
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 12\r\n\r\nnot gzipped!"
    )

    with pytest.raises(zlib.error):
        response.read()
    assert origin.idle == []


def test_closing_drops_the_connection_and_a_second_close_does_nothing():
    response, origin, connection = answer(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe")

    response.close()
    response.close()
    response.release()

    assert connection.closed and origin.idle == []


def test_header_lines_keep_names_and_values_as_given():
    lines = header_lines({"Content-Type": "application/json", "x-api-key": "k é"})

    assert lines == "Content-Type: application/json\r\nx-api-key: k é\r\n".encode("latin-1")


@pytest.mark.parametrize(
    ("url", "head"),
    [
        ("http://Example.com/v1/chat?x=1", b"POST /v1/chat?x=1 HTTP/1.1\r\nHost: example.com\r\n"),
        ("https://example.com:443/v1", b"POST /v1 HTTP/1.1\r\nHost: example.com\r\n"),
        ("http://127.0.0.1:8000", b"POST / HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"),
        ("http://[::1]:8000/a b", b"POST /a%20b HTTP/1.1\r\nHost: [::1]:8000\r\n"),
    ],
)
def test_a_url_becomes_a_request_line_and_host(url, head):
    target = UpstreamPool(1).target(normalized_url(url))

    assert target.head == head


@pytest.mark.parametrize("url", ["ftp://example.com/x", "/v1/chat", "http:///v1"])
def test_a_url_that_is_not_http_is_refused(url):
    with pytest.raises(ValueError):
        normalized_url(url)
