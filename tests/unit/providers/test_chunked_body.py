"""ChunkedBody: a chunked upstream body decoded from its reads, however they cut it."""

import http.client
import io
import sys

import pytest

from app.providers.transport import MAX_TRAILER_LINES, ChunkedBody

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
DATA = [b"data: one\n\n", b"x" * 300, b"data: two\n\ndata: three\n\n"]
BODY = (
    b"%x\r\n%s\r\n" % (len(DATA[0]), DATA[0])
    + b"%X;name=value\r\n%s\r\n" % (len(DATA[1]), DATA[1])
    + b"%x\r\n%s\r\n" % (len(DATA[2]), DATA[2])
    + b"0\r\nX-Trailer: yes\r\n\r\n"
)


class GivenReads(io.RawIOBase):
    """A socket whose reads bring the given pieces, one each, to ``recv`` or a buffer."""

    def __init__(self, *reads: bytes) -> None:
        self.reads = [read for read in reads if read]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:
        read = self.recv(len(buffer))
        buffer[: len(read)] = read
        return len(read)

    def recv(self, size: int) -> bytes:
        if not self.reads:
            return b""
        read, rest = self.reads[0][:size], self.reads[0][size:]
        if rest:
            self.reads[0] = rest
        else:
            self.reads.pop(0)
        return read

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self)


def chunked_body(*reads: bytes) -> ChunkedBody:
    """Return the decoder of a response whose socket reads ``reads``, the head in the first."""
    sock = GivenReads(*reads)
    response = http.client.HTTPResponse(sock)
    response.begin()
    return ChunkedBody(response, sock)


def decoded(body: ChunkedBody) -> list[bytes]:
    items = []
    while not body.ended():
        items.append(body.data_of_next_read())
    return items


@pytest.mark.parametrize("cut", range(len(BODY) + 1))
def test_a_body_cut_anywhere_in_two_reads_decodes_to_its_data(cut):
    body = chunked_body(HEAD + BODY[:cut], BODY[cut:])

    assert b"".join(decoded(body)) == b"".join(DATA)
    assert body.response.isclosed()


def test_a_body_read_a_byte_at_a_time_decodes_to_its_data():
    body = chunked_body(HEAD, *(BODY[i : i + 1] for i in range(len(BODY))))

    assert b"".join(decoded(body)) == b"".join(DATA)
    assert body.response.isclosed()


def test_each_read_is_relayed_as_it_comes_unless_it_ends_inside_the_framing():
    second = BODY.index(b"\r\n", BODY.index(b"12C;")) + 2  # where the second chunk's data starts
    third = second + len(DATA[1]) + 2  # the third chunk's size line
    # The head and the body up to 84 bytes into the second chunk's data; the rest of that
    # data and one byte of the third chunk's size line; the rest.
    reads = [HEAD + BODY[: second + 84], BODY[second + 84 : third + 1], BODY[third + 1 :]]

    items = decoded(chunked_body(*reads))

    # The read that ended inside a size line waited for the next, whose data it joins.
    assert items == [DATA[0] + b"x" * 84, b"x" * 216 + DATA[2]]


def test_http_client_reads_on_where_a_read_left_the_body_and_the_stream_keeps_no_big_buffer():
    second = BODY.index(b"\r\n", BODY.index(b"12C;")) + 2
    body = chunked_body(HEAD + BODY[: second + 8], BODY[second + 8 :])
    head_buffer = sys.getsizeof(body.response.fp)

    first = body.data_of_next_read()

    assert first == DATA[0] + b"x" * 8
    assert body.response.chunk_left == 292
    assert sys.getsizeof(body.response.fp) < 1_000 < 8_000 < head_buffer
    assert first + body.response.read() == b"".join(DATA)
    assert body.response.isclosed()


@pytest.mark.parametrize(
    ("reads", "error"),
    [
        ([b"zz\r\n"], http.client.IncompleteRead),
        ([b"-5\r\nhello\r\n"], http.client.IncompleteRead),
        ([b"5\r\nhel"], http.client.IncompleteRead),  # the connection closes mid-chunk
        ([b"5" * 70_000], http.client.LineTooLong),
        ([b"0\r\n" + b"X: y\r\n" * (MAX_TRAILER_LINES + 1)], http.client.HTTPException),
    ],
)
def test_a_malformed_or_cut_body_fails_as_http_clients_would(reads, error):
    body = chunked_body(HEAD, *reads)

    with pytest.raises(error):
        decoded(body)
