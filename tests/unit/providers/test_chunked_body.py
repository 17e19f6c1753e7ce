"""A chunked upstream body, decoded from its socket's reads however they cut it."""

import http.client
import sys

import pytest

from app.providers.http1 import MAX_TRAILER_LINES, UpstreamResponse, receive

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
DATA = [b"data: one\n\n", b"x" * 300, b"data: two\n\ndata: three\n\n"]
BODY = (
    b"%x\r\n%s\r\n" % (len(DATA[0]), DATA[0])
    + b"%X;name=value\r\n%s\r\n" % (len(DATA[1]), DATA[1])
    + b"%x\r\n%s\r\n" % (len(DATA[2]), DATA[2])
    + b"0\r\nX-Trailer: yes\r\n\r\n"
)


class GivenReads:
    """A socket whose reads bring the given pieces, one each, then the peer's close."""

    def __init__(self, *reads: bytes) -> None:
        self.reads = [read for read in reads if read]
        self.made = 0

    def recv(self, size: int) -> bytes:
        self.made += 1
        if not self.reads:
            return b""
        read, rest = self.reads[0][:size], self.reads[0][size:]
        if rest:
            self.reads[0] = rest
        else:
            self.reads.pop(0)
        return read


def chunked_body(*reads: bytes) -> UpstreamResponse:
    """Return the response whose socket reads ``reads``, the head in the first."""
    return receive(GivenReads(*reads))  # type: ignore[arg-type]


def decoded(response: UpstreamResponse) -> list[bytes]:
    items = []
    while not response.ended:
        items.append(response.read1())
    return items


@pytest.mark.parametrize("cut", range(len(BODY) + 1))
def test_a_body_cut_anywhere_in_two_reads_decodes_to_its_data(cut):
    response = chunked_body(HEAD + BODY[:cut], BODY[cut:])

    assert b"".join(decoded(response)) == b"".join(DATA)
    assert response.ended


def test_a_body_read_a_byte_at_a_time_decodes_to_its_data():
    response = chunked_body(HEAD, *(BODY[i : i + 1] for i in range(len(BODY))))

    assert b"".join(decoded(response)) == b"".join(DATA)
    assert response.ended


def test_each_read_is_relayed_as_it_comes_unless_it_ends_inside_the_framing():
    second = BODY.index(b"\r\n", BODY.index(b"12C;")) + 2  # where the second chunk's data starts
    third = second + len(DATA[1]) + 2  # the third chunk's size line
    # The head and the body up to 84 bytes into the second chunk's data; the rest of that
    # data and one byte of the third chunk's size line; the rest.
    reads = [HEAD + BODY[: second + 84], BODY[second + 84 : third + 1], BODY[third + 1 :]]

    items = decoded(chunked_body(*reads))

    # The read that ended inside a size line waited for the next, whose data it joins.
    assert items == [DATA[0] + b"x" * 84, b"x" * 216 + DATA[2]]


def test_the_body_reads_on_where_a_read_left_it_and_the_stream_keeps_no_buffer():
    second = BODY.index(b"\r\n", BODY.index(b"12C;")) + 2
    sock = GivenReads(HEAD + BODY[: second + 8], BODY[second + 8 :])
    response = receive(sock)  # type: ignore[arg-type]

    first = response.read1()

    assert first == DATA[0] + b"x" * 8
    # What came with the head was taken by the first read, without a read of the socket.
    assert sock.made == 1
    assert response.framing.left == 292
    kept = sys.getsizeof(response.first) + sys.getsizeof(response.framing.cut)
    assert kept < 100 < len(HEAD + BODY[: second + 8])
    assert first + response.read() == b"".join(DATA)
    assert response.ended


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
    response = chunked_body(HEAD, *reads)

    with pytest.raises(error):
        decoded(response)
