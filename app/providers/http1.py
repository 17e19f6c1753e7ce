"""HTTP/1.1 to the upstreams: kept-alive connections, a request in one write, answers read here.

urllib3 opens each connection: its socket options (TCP_NODELAY), its connect timeout
and errors, and TLS checked as requests checks it (``CERT_REQUIRED``, requests' CA
bundle). The exchange on the connection is written and read here, on its socket, for
two properties of a call that neither urllib3's nor http.client's public API gives:

- a request's head and body leave in one write. urllib3's ``HTTPConnection.request``
  and http.client's ``endheaders(message_body)`` both send the head, then the body: two
  system calls a call and, since the sockets set TCP_NODELAY, two packets;
- a stream's read hands over all that one wait brought. http.client buffers what came
  with the head, hands a chunked body over one HTTP chunk a read, and cannot be asked
  what it holds without its private attributes.

Read here, a held stream keeps no read buffer while it waits (at most the start of a
framing line cut by a read), and a head costs a split, not http.client's email parser.
"""

from __future__ import annotations

import http.client
import re
import select
import socket
import sys
import zlib
from collections.abc import Mapping

import requests.certs
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.util import parse_url

READ_SIZE = 64 * 1024
# http.client's bounds: the longest line of a chunked body's framing (here also the
# longest head, far above an API's), and the most header or trailer lines.
MAX_LINE = 65_536
MAX_HEADERS = 100
MAX_TRAILER_LINES = 100
# The blank line that ends a head: after CRLF, as sent, or a bare LF, as http.client reads.
HEAD_END = re.compile(rb"\n\r?\n")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# What would end a header's line early, letting a value add headers of its own.
LINE_BREAK = re.compile(r"[\r\n\0]")
# What http.client refuses in a request target: controls and spaces.
NOT_IN_TARGET = re.compile(r"[\x00-\x20\x7f]")
DEFAULT_PORTS = {"http": 80, "https": 443}
# The codings Decoder undoes, to be asked for in a request's Accept-Encoding.
ACCEPT_ENCODING = "gzip, deflate"
BODILESS_STATUSES = frozenset({204, 304})
# The system's poll, also in a gevent worker, where select.poll is gevent's once
# patched. Patching takes gevent.monkey: where it is not loaded, select.poll is still
# the system's (and stays so here if patched later); gevent is not loaded for it.
UNPATCHED_POLL = (
    sys.modules["gevent.monkey"].get_original("select", "poll")
    if "gevent.monkey" in sys.modules
    else select.poll
)


def readable_now(sock: socket.socket) -> bool:
    """Tell whether ``sock`` has something to read at once: data, or its peer's close."""
    poller = UNPATCHED_POLL()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class Origin:
    """An upstream's scheme, host and port, and its idle kept-alive connections.

    A kept-alive connection is taken again only if nothing is waiting to be read on it:
    an idle connection that is readable was closed by the upstream. The check polls with
    the system's poll: urllib3's ``util.wait_for_read`` looks ``select.poll`` up when
    called, gevent's in a worker, which polls through gevent's hub at about fifteen times
    the cost of the system call itself (18 us against 1.2 us); a poll that waits no time
    cannot block the worker. The most recently used connection goes first.
    """

    def __init__(self, scheme: str, host: str, port: int, pool_size: int) -> None:
        self.scheme, self.host, self.port = scheme, host, port
        self.pool_size = pool_size
        self.idle: list[HTTPConnection] = []
        # Connections opened so far: how often a request found none to reuse.
        self.opened = 0

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def connection(self, connect_timeout: float) -> HTTPConnection:
        """Return an idle connection its upstream has not closed, else a new one."""
        idle = self.idle
        while idle:
            try:
                connection = idle.pop()
            except IndexError:  # another thread took the last one meanwhile
                break
            if connection.sock is not None and not readable_now(connection.sock):
                return connection
            connection.close()
        return self.open(connect_timeout)

    def open(self, connect_timeout: float) -> HTTPConnection:
        """Connect anew, as requests' adapter would (its TLS checks included)."""
        if self.scheme == "https":
            connection: HTTPConnection = HTTPSConnection(
                self.host,
                self.port,
                timeout=connect_timeout,
                cert_reqs="CERT_REQUIRED",
                ca_certs=requests.certs.where(),
            )
        else:
            connection = HTTPConnection(self.host, self.port, timeout=connect_timeout)
        try:
            connection.connect()
        except BaseException:
            connection.close()
            raise
        self.opened += 1
        return connection

    def put(self, connection: HTTPConnection) -> None:
        """Keep ``connection`` for a later request, or close it when enough are kept."""
        if len(self.idle) < self.pool_size:
            self.idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Close every idle connection."""
        while self.idle:
            self.idle.pop().close()


class Target:
    """A URL requests go to: its origin, and the request line and Host header naming it."""

    __slots__ = ("origin", "head")

    def __init__(self, origin: Origin, head: bytes) -> None:
        self.origin = origin
        self.head = head


def url_parts(url: str) -> tuple[str, str, int, str]:
    """Return ``url``'s scheme, host, port and request target; ValueError if not HTTP's."""
    parsed = parse_url(url)
    scheme = (parsed.scheme or "").lower()
    if scheme not in DEFAULT_PORTS or not parsed.host:
        raise ValueError(f"not an http or https URL: {url!r}")
    target = parsed.request_uri
    if NOT_IN_TARGET.search(target):
        raise ValueError(f"the URL's path holds a control character or a space: {url!r}")
    return scheme, parsed.host, parsed.port or DEFAULT_PORTS[scheme], target


def normalized_url(url: str) -> str:
    """Return ``url`` as it is sent (host lower-cased, path quoted); ValueError if not HTTP's."""
    url_parts(url)
    return parse_url(url).url


class UpstreamPool:
    """Kept-alive connections to the upstream URLs of an adapter, ``pool_size`` idle per origin.

    Each URL is parsed once, into its origin's pool and its request's first two lines.
    No request is retried: a POST may have reached the model.
    """

    def __init__(self, pool_size: int) -> None:
        self.pool_size = pool_size
        self.origins: dict[tuple[str, str, int], Origin] = {}
        self.targets: dict[str, Target] = {}

    @property
    def connections_opened(self) -> int:
        """Count the connections opened since the pool was made or closed."""
        return sum(origin.opened for origin in self.origins.values())

    @property
    def idle_connections(self) -> int:
        """Count the connections kept for later requests."""
        return sum(len(origin.idle) for origin in self.origins.values())

    def target(self, url: str) -> Target:
        """Return where requests to ``url`` go, parsing it the first time."""
        if (target := self.targets.get(url)) is None:
            scheme, host, port, path = url_parts(url)
            key = (scheme, host, port)
            if (origin := self.origins.get(key)) is None:
                origin = self.origins[key] = Origin(scheme, host, port, self.pool_size)
            host_header = host if port == DEFAULT_PORTS[scheme] else f"{host}:{port}"
            head = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode("ascii")
            target = self.targets[url] = Target(origin, head)
        return target

    def post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout: tuple[float, float]
    ) -> UpstreamResponse:
        """POST ``body`` with ``headers`` (Host and Content-Length added); return the answer's head.

        ``timeout`` is the (connect, read) timeout in seconds. The body is read by the
        response's own methods; the connection goes back to the pool once it is read.
        """
        target = self.target(url)
        request = b"".join((target.head, header_lines(headers), content_length(body), body))
        origin = target.origin
        connection = origin.connection(timeout[0])
        try:
            sock = connection.sock
            sock.settimeout(timeout[1])
            sock.sendall(request)
            return receive(sock, origin, connection)
        except BaseException:
            connection.close()
            raise

    def close(self) -> None:
        """Close every idle connection and forget the URLs: later calls connect anew."""
        for origin in self.origins.values():
            origin.close()
        self.origins.clear()
        self.targets.clear()


def header_lines(headers: Mapping[str, str]) -> bytes:
    """Encode ``headers`` as a head's lines; ValueError for a name or value that cannot be sent."""
    lines = []
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(name) or LINE_BREAK.search(value):
            raise ValueError(f"header {name!r} cannot be sent as it is")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines).encode("latin-1")


def content_length(body: bytes) -> bytes:
    """Return the Content-Length line of ``body`` and the blank line that ends the head."""
    return b"Content-Length: %d\r\n\r\n" % len(body)


def receive(
    sock: socket.socket, origin: Origin | None = None, connection: HTTPConnection | None = None
) -> UpstreamResponse:
    """Read a response's head off ``sock``; return the response, its body left to read.

    Interim answers (100 Continue, 103 Early Hints) are skipped, as the final one follows.
    """
    head, rest = read_head(sock, b"")
    http11, status, headers = parse_head(head)
    while status < 200:
        head, rest = read_head(sock, bytes(rest))
        http11, status, headers = parse_head(head)
    return UpstreamResponse(status, headers, rest, http11, sock, origin, connection)


def read_head(sock: socket.socket, buffer: bytes) -> tuple[bytes, memoryview]:
    """Read until a blank line ends a head; return the head and a view of what came after it.

    A view, not a copy: what came with the head may be most of a read of READ_SIZE.
    """
    while (end := HEAD_END.search(buffer)) is None:
        if len(buffer) > MAX_LINE:
            raise http.client.LineTooLong("response head")
        read = sock.recv(READ_SIZE)
        if not read:
            raise http.client.RemoteDisconnected("the upstream closed the connection unanswered")
        buffer = buffer + read if buffer else read
    return buffer[: end.start() + 1], memoryview(buffer)[end.end() :]


def parse_head(head: bytes) -> tuple[bool, int, dict[str, str]]:
    """Return whether a head says HTTP/1.1, its status and its headers (names lower-cased)."""
    lines = head.decode("latin-1").split("\n")
    if len(lines) > MAX_HEADERS + 2:
        raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
    version, _, rest = lines[0].rstrip("\r").partition(" ")
    status = rest.partition(" ")[0]
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(status) != 3:
        raise http.client.BadStatusLine(lines[0])
    # Latin-1 has digits (², ³) that str.isdigit takes and int() refuses.
    if not (status.isascii() and status.isdigit()) or status[0] == "0":
        raise http.client.BadStatusLine(lines[0])
    return version == "HTTP/1.1", int(status), header_fields(lines[1:])


def header_fields(lines: list[str]) -> dict[str, str]:
    """Return the headers of a head's lines; a repeated header's values joined by commas."""
    headers: dict[str, str] = {}
    name = ""
    for line in lines:
        if line[:1] in (" ", "\t") and name:
            # A folded line continues the header before it.
            headers[name] = f"{headers[name]} {line.strip()}"
            continue
        name, colon, value = line.partition(":")
        if not colon:
            # Not a header: http.client's parser sets such a line aside too.
            name = ""
            continue
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


class UpstreamResponse:
    """An upstream's answer: status, headers (names lower-cased), then a body read off its socket.

    ``read1`` reads the socket once and returns that read's data, decoded; ``read`` the
    whole body (``content``). A body read to its end gives its connection back to its
    pool, unless the upstream said to close it; ``close`` drops the connection at once.
    """

    __slots__ = (
        "status",
        "headers",
        "content",
        "framing",
        "decoder",
        "first",
        "keep_alive",
        "sock",
        "origin",
        "connection",
    )

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        first: bytes | memoryview,
        http11: bool,
        sock: socket.socket,
        origin: Origin | None,
        connection: HTTPConnection | None,
    ) -> None:
        self.status, self.headers = status, headers
        self.content: bytes | None = None
        self.framing = framing = framing_of(status, headers)
        if framing.ended and first:
            # Bytes past a body that ended with its head: the connection is out of step.
            framing.surplus = True
        self.decoder = decoder_of(headers.get("content-encoding"))
        # What came with the head, taken by the first read.
        self.first = first
        self.keep_alive = keeps_alive(http11, headers.get("connection"))
        self.sock, self.origin, self.connection = sock, origin, connection

    @property
    def ended(self) -> bool:
        """Tell whether the body's end was read."""
        return self.framing.ended

    def read1(self) -> bytes:
        """Read the socket once, on at once if the read ends inside framing; return its data.

        The first read takes what came with the head instead, if anything did. The data
        may be empty: a read of framing alone. At the body's end, the connection goes back
        to its pool.
        """
        framing = self.framing
        data = framing.take(self.next_read())
        while framing.cut_inside() and not framing.ended:
            data += framing.take(self.next_read())
        if self.decoder is not None:
            data = self.decoder.decode(data, end=framing.ended)
        if framing.ended:
            self.release()
        return data

    def next_read(self) -> bytes:
        """Return what came with the head, once, then each call one read of the socket."""
        if self.first:
            read, self.first = self.first, b""
            return bytes(read)
        if not (read := self.sock.recv(READ_SIZE)):
            self.framing.close()
        return read

    def read(self) -> bytes:
        """Read the rest of the body, once; return the whole body. A failed read closes."""
        if self.content is None:
            pieces = []
            try:
                if self.first and self.decoder is None and type(self.framing) is LengthFraming:
                    # Joined from the view: what came with the head is copied once, not twice.
                    first, self.first = self.first, b""
                    pieces.append(self.framing.take(first))
                while not self.framing.ended:
                    pieces.append(self.read1())
            except BaseException:
                self.close()
                raise
            self.content = b"".join(pieces)
            # A body that was over with its head (a 204, an empty one) was never read.
            self.release()
        return self.content

    def release(self) -> None:
        """Give the connection back to its pool if its body was read cleanly, else close it."""
        connection, self.connection = self.connection, None
        if connection is None:
            return
        framing = self.framing
        if self.origin is not None and framing.ended and self.keep_alive and not framing.surplus:
            self.origin.put(connection)
        else:
            connection.close()

    def close(self) -> None:
        """Close the connection, unless it went back to its pool; an upstream then stops."""
        connection, self.connection = self.connection, None
        if connection is not None:
            connection.close()


def keeps_alive(http11: bool, connection: str | None) -> bool:
    """Tell whether a response lets its connection serve another request."""
    if connection is None:
        return http11
    options = {option.strip().lower() for option in connection.split(",")}
    return "close" not in options if http11 else "keep-alive" in options


def framing_of(status: int, headers: Mapping[str, str]) -> Framing:
    """Return how a response's body is delimited: chunks, a length, or the connection's close."""
    if status in BODILESS_STATUSES:
        return LengthFraming(0)
    if (codings := headers.get("transfer-encoding")) is not None:
        if codings.rpartition(",")[2].strip().lower() == "chunked":
            return ChunkedFraming()
        return CloseFraming()
    if (length := headers.get("content-length")) is not None:
        return LengthFraming(body_length(length))
    return CloseFraming()


def body_length(value: str) -> int:
    """Return a Content-Length's length (repeated, all the same); HTTPException if it has none."""
    lengths = {length.strip() for length in value.split(",")}
    length = lengths.pop()
    if lengths or not (length.isascii() and length.isdigit()):
        raise http.client.HTTPException(f"invalid Content-Length: {value!r}")
    return int(length)


class LengthFraming:
    """A body of a Content-Length's bytes."""

    __slots__ = ("left", "ended", "surplus")

    def __init__(self, length: int) -> None:
        self.left = length
        self.ended = length == 0
        # Bytes came past the body's end: the connection is out of step, not reusable.
        self.surplus = False

    def take(self, read: bytes) -> bytes:
        """Consume ``read``; return the body's bytes in it."""
        left = self.left
        if len(read) < left:
            self.left = left - len(read)
            return read
        self.left, self.ended, self.surplus = 0, True, len(read) > left
        return read[:left] if self.surplus else read

    def cut_inside(self) -> bool:
        """Tell whether the last read ended inside framing: a length has none."""
        return False

    def close(self) -> None:
        """Take the connection's close, before the body's end: IncompleteRead."""
        if not self.ended:
            raise http.client.IncompleteRead(b"", self.left)


class CloseFraming:
    """A body that ends where the upstream closes the connection."""

    __slots__ = ("ended",)

    # The connection is closed: it serves nothing after.
    surplus = True

    def __init__(self) -> None:
        self.ended = False

    def take(self, read: bytes) -> bytes:
        """Consume ``read``; all of it is the body's."""
        return read

    def cut_inside(self) -> bool:
        """Tell whether the last read ended inside framing: there is none."""
        return False

    def close(self) -> None:
        """Take the connection's close: the body's end."""
        self.ended = True


class ChunkedFraming:
    """A chunked body, decoded from reads however they cut it.

    ``left`` says where the body stands between reads: the bytes left of the chunk being
    read, 0 while its CRLF is, None at a size line. A read that ends inside a size line,
    a CRLF or the trailer leaves that line's start in ``cut``, and the next read is made
    at once: an upstream writes a chunk's framing with its data. The trailer's end is the
    body's; anything after it is not this response's.
    """

    __slots__ = ("left", "trailer_lines", "cut", "ended", "surplus")

    def __init__(self) -> None:
        self.left: int | None = None
        # Trailer lines read, once the last chunk's size line was: None before.
        self.trailer_lines: int | None = None
        self.cut = b""
        self.ended = self.surplus = False

    def take(self, read: bytes) -> bytes:
        """Consume ``read``; return its chunk data; keep a line it cuts in ``cut``."""
        buffer = self.cut + read if self.cut else read
        pieces = []
        position, end, left = 0, len(buffer), self.left
        while position < end:
            if left:
                taken = min(left, end - position)
                pieces.append(buffer[position : position + taken])
                position += taken
                left -= taken
                continue
            if left == 0:
                if end - position < 2:
                    break
                position, left = position + 2, None
                continue
            newline = buffer.find(b"\n", position)
            if newline < 0:
                break
            line, position = buffer[position:newline], newline + 1
            if self.trailer_lines is not None:
                position = self.take_trailer_line(line, position, end)
            elif (left := chunk_size(line)) == 0:
                self.trailer_lines, left = 0, None
        self.cut, self.left = buffer[position:], left
        self.check_bounds()
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def take_trailer_line(self, line: bytes, position: int, end: int) -> int:
        """Count a trailer line; at the blank one, end the body. Return where to read on."""
        self.trailer_lines = (self.trailer_lines or 0) + 1
        if line.strip():
            return position
        self.ended, self.surplus = True, position < end
        return end

    def check_bounds(self) -> None:
        """Raise as http.client would for an over-long framing line or too many trailer lines."""
        if len(self.cut) > MAX_LINE:
            raise http.client.LineTooLong("chunk size or trailer line")
        if (self.trailer_lines or 0) > MAX_TRAILER_LINES:
            raise http.client.HTTPException(f"more than {MAX_TRAILER_LINES} trailer lines")

    def cut_inside(self) -> bool:
        """Tell whether the last read ended inside a framing line or the trailer."""
        return bool(self.cut) or self.trailer_lines is not None

    def close(self) -> None:
        """Take the connection's close, before the body's end: IncompleteRead."""
        if not self.ended:
            raise http.client.IncompleteRead(b"")


Framing = LengthFraming | CloseFraming | ChunkedFraming


def chunk_size(line: bytes) -> int:
    """Return the size a chunk's size line gives; raise IncompleteRead if it gives none."""
    try:
        size = int(line.partition(b";")[0], 16)
    except ValueError:
        size = -1
    if size < 0:
        raise http.client.IncompleteRead(b"")
    return size


def decoder_of(coding: str | None) -> Decoder | None:
    """Return the decoder of a Content-Encoding, None for none; HTTPException if unknown."""
    if coding is None or (coding := coding.strip().lower()) in ("", "identity"):
        return None
    if coding not in ("gzip", "x-gzip", "deflate"):
        raise http.client.HTTPException(f"unsupported Content-Encoding: {coding!r}")
    return Decoder(coding != "deflate")


class Decoder:
    """Undoes a gzip or deflate Content-Encoding (the ones the gateway accepts) as reads come.

    gzip may come in several members, one after the other. deflate is meant as zlib's
    format, but some servers send it raw: as urllib3 does, raw is read when the first
    bytes are not a zlib header.
    """

    __slots__ = ("gzip", "zlib", "start")

    def __init__(self, gzip: bool) -> None:
        self.gzip = gzip
        self.zlib = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        # deflate's first bytes, held until there are two to tell its format by; None
        # once told, and for gzip.
        self.start: bytes | None = None if gzip else b""

    def decode(self, data: bytes, *, end: bool) -> bytes:
        """Return what ``data`` decodes to; at the body's ``end``, all that is left too."""
        if self.start is not None:
            data = self.deflate_start(data, end=end)
        decoded = self.zlib.decompress(data)
        while self.gzip and self.zlib.eof and self.zlib.unused_data:
            rest = self.zlib.unused_data
            self.zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
            decoded += self.zlib.decompress(rest)
        return decoded + self.zlib.flush() if end else decoded

    def deflate_start(self, data: bytes, *, end: bool) -> bytes:
        """Hold deflate's first bytes until two tell its format; return those to decode."""
        start = (self.start or b"") + data
        if len(start) < 2 and not end:
            self.start = start
            return b""
        self.start = None
        if not is_zlib_header(start[:2]):
            self.zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        return start


def is_zlib_header(start: bytes) -> bool:
    """Tell whether two bytes open zlib's format: deflate's method, a checksum of 31."""
    return len(start) == 2 and start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0
