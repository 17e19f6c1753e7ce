"""Reaching an upstream over HTTP, and its failures in the gateway's terms.

Each upstream gets one requests transport adapter: one pool of keep-alive connections,
sized for a gevent worker's many concurrent requests. A call hands it a request prepared
by hand (``prepared_post``) instead of going through a ``requests.Session``: a JSON API
needs none of what a session adds to every call (merging settings, proxies and .netrc
from the environment, a cookie jar shared by all callers, redirects, hooks), and doing
without it halves the CPU of a call. The API key is read from the environment variable
the catalog names, when a request needs it, so a catalog loads (and ``flask catalog
list`` works) without the keys. Nothing here puts a key, an upstream's address or its
own error text for a 401/403 into a message a caller can see.
"""

from __future__ import annotations

import http.client
import io
import logging
import math
import os
import select
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.connection import HTTPConnection, HTTPSConnection

from app.encoding import dumps, loads
from app.observability.trace import REQUEST_ID_HEADER, current_request_id
from app.providers.base import Adapter, ChatRequest, RouteTarget, UpstreamConfig
from app.providers.errors import (
    UpstreamError,
    UpstreamMisconfigured,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from app.providers.tokens import (
    DEFAULT_ENCODING,
    DEFAULT_IMAGE_TOKENS,
    LOW_DETAIL_IMAGE_TOKENS,
    count_text,
    encoding_named,
    encoding_names,
    estimate_prompt_tokens,
    prompt_token_bound,
)

log = logging.getLogger(__name__)

DEFAULT_POOL_SIZE = 100
READ_SIZE = 64 * 1024
# The read buffer a chunked stream keeps once its first read took what its head's read
# had buffered: only http.client's own reads of the body's end still use it.
STREAM_BUFFER_SIZE = 64
# The longest size line or trailer line a chunked body may have: http.client's own bound.
MAX_FRAMING_LINE = 65_536
MAX_TRAILER_LINES = 100
BODY_END_SECONDS = 0.1
MAX_MESSAGE_CHARACTERS = 1_000
# The system's poll, also in a gevent worker, where select.poll is gevent's once
# patched. Patching takes gevent.monkey: where it is not loaded, select.poll is still
# the system's (and stays so here if patched later); gevent is not loaded for it.
UNPATCHED_POLL = (
    sys.modules["gevent.monkey"].get_original("select", "poll")
    if "gevent.monkey" in sys.modules
    else select.poll
)
REJECTED = frozenset({400, 413, 422})
OVERLOADED = frozenset({429, 503, 529})
TIMED_OUT = frozenset({408, 504})


def as_count(value: Any) -> int:
    """Return a token count from an upstream's usage, 0 when absent or not a count."""
    return value if type(value) is int and value > 0 else 0


def open_pool(pool_size: int) -> UpstreamPool:
    """Return a transport keeping up to ``pool_size`` keep-alive connections, no retries."""
    return UpstreamPool(pool_connections=1, pool_maxsize=pool_size, max_retries=0)


class UpstreamPool(HTTPAdapter):
    """requests' transport adapter, doing once per URL what it would do on every call.

    An upstream is called at a few URLs (its base URL and a path or two), always with
    the same TLS settings and never through a proxy (``send`` is given none). requests
    parses the URL three times a call to find the connection pool, the path to send and
    the proxy to use, and builds the pool's key each time; here each URL's pool and path
    are found once (bench/instructions.py: 3.99M -> 3.77M instructions a whole request,
    with the cookies below). A response gets no cookie jar filled from its
    ``Set-Cookie`` headers: the gateway never sends an upstream's cookies back, and
    reading them cost a cookie jar's parse of the headers.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._pools: dict[tuple[str, Any, Any], urllib3.HTTPConnectionPool] = {}
        self._paths: dict[str, str] = {}

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        """Make the pool manager as requests does, its pools opening upstream connections."""
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": UpstreamHTTPPool,
            "https": UpstreamHTTPSPool,
        }

    def get_connection_with_tls_context(
        self,
        request: requests.PreparedRequest,
        verify: Any,
        proxies: Mapping[str, str] | None = None,
        cert: Any = None,
    ) -> urllib3.HTTPConnectionPool:
        """Return the connection pool for the request's URL and TLS settings."""
        if proxies:
            return super().get_connection_with_tls_context(request, verify, proxies, cert)
        key = (request.url, verify, cert)
        if (pool := self._pools.get(key)) is None:
            pool = super().get_connection_with_tls_context(request, verify, None, cert)
            self._pools[key] = pool
        return pool

    def request_url(
        self, request: requests.PreparedRequest, proxies: Mapping[str, str] | None
    ) -> str:
        """Return what the request line names: the URL's path (and query) without a proxy."""
        if proxies:
            return super().request_url(request, proxies)
        if (path := self._paths.get(request.url)) is None:
            path = self._paths[request.url] = super().request_url(request, proxies)
        return path

    def build_response(
        self, req: requests.PreparedRequest, resp: urllib3.HTTPResponse
    ) -> requests.Response:
        """Wrap urllib3's response as requests does, without reading its cookies."""
        response = requests.Response()
        response.status_code = resp.status
        response.headers = CaseInsensitiveDict(resp.headers)
        response.encoding = requests.utils.get_encoding_from_headers(response.headers)
        response.raw = resp
        response.reason = resp.reason
        response.url = req.url
        response.request = req
        response.connection = self
        return response

    def close(self) -> None:
        """Let every pool go, as requests does: later calls open new ones."""
        self._pools.clear()
        super().close()


def readable_now(sock: socket.socket) -> bool:
    """Tell whether ``sock`` has something to read at once: data, or its peer's close."""
    poller = UNPATCHED_POLL()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class ReuseCheckedByPoll:
    """A kept-alive connection's check before reuse, made with the system's poll.

    urllib3 takes a connection from its pool only if nothing is waiting to be read on it
    (an idle connection that is readable was closed by the upstream). In a gevent worker
    its check polls through gevent's hub, about fifteen times the cost of the system
    call itself (18 us against 1.2 us here); a poll that waits no time cannot block the
    worker, so gevent has nothing to add.
    """

    sock: socket.socket | None

    @property
    def is_connected(self) -> bool:
        """Tell whether the connection is open and idle, as urllib3's own property does."""
        return self.sock is not None and not readable_now(self.sock)


class HeadWithBody:
    """Sends a request's head and its body, given whole, in one write.

    urllib3 writes the head, then the body: two system calls a call, and two packets
    (its sockets do not wait to fill one: TCP_NODELAY). A body given in pieces (a file,
    an iterable) is written as urllib3 writes it.
    """

    _head: bytes | None = None
    _holding_head = False

    def request(
        self, method: str, url: str, body: Any = None, headers: Any = None, **options: Any
    ) -> None:
        """Send the request, its head held back to go out with a body of bytes."""
        self._holding_head = type(body) is bytes and bool(body) and not options.get("chunked")
        try:
            super().request(method, url, body, headers, **options)  # type: ignore[misc]
        finally:
            self._holding_head, self._head = False, None

    def send(self, data: Any) -> None:
        """Write ``data``; the head, while held, goes out with the write that follows it."""
        if self._holding_head:
            if self._head is None:
                self._head = data
                return
            data = self._head + data
            self._holding_head, self._head = False, None
        super().send(data)  # type: ignore[misc]


class UpstreamHTTPConnection(ReuseCheckedByPoll, HeadWithBody, HTTPConnection):
    """urllib3's HTTP connection, checked before reuse by a plain poll, writing once."""


class UpstreamHTTPSConnection(ReuseCheckedByPoll, HeadWithBody, HTTPSConnection):
    """urllib3's HTTPS connection, checked before reuse by a plain poll, writing once."""


class UpstreamHTTPPool(urllib3.HTTPConnectionPool):
    """A pool of UpstreamHTTPConnections."""

    ConnectionCls = UpstreamHTTPConnection


class UpstreamHTTPSPool(urllib3.HTTPSConnectionPool):
    """A pool of UpstreamHTTPSConnections."""

    ConnectionCls = UpstreamHTTPSConnection


def prepared_post(url: str, body: bytes, headers: Mapping[str, str]) -> requests.PreparedRequest:
    """Return a POST of ``body`` to ``url`` as ``Request.prepare()`` would build it.

    ``url`` must already be in prepared form (``prepared_url``), and ``headers`` hold
    every header to send: nothing is merged in later.
    """
    prepared = requests.PreparedRequest()
    prepared.method = "POST"
    prepared.url = url
    prepared.headers = CaseInsensitiveDict(headers)
    prepared.headers["Content-Length"] = str(len(body))
    prepared.body = body
    return prepared


def prepared_url(url: str) -> str:
    """Return ``url`` normalised as requests sends it (IDNA host, quoted path)."""
    return requests.Request("POST", url).prepare().url or url


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """Return how long the upstream asked to wait (``retry-after-ms`` or ``Retry-After``)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if not value:
            continue
        try:
            return max(float(value) * scale, 0.0)
        except ValueError:
            pass
        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None
    return None


def upstream_error_message(body: Any) -> tuple[str | None, str | None]:
    """Find the message and param in an error body (OpenAI, Anthropic or vLLM shape)."""
    if not isinstance(body, dict):
        return None, None
    error = body.get("error")
    if isinstance(error, dict):
        message, param = error.get("message"), error.get("param")
    else:
        message, param = (error if isinstance(error, str) else body.get("message")), None
    message = message if isinstance(message, str) and message else None
    return message, param if isinstance(param, str) else None


def received_chunks(response: requests.Response) -> Iterator[bytes]:
    """Yield a streamed body's bytes as they arrive: each item is all that one wait brought.

    A read hands over what the socket has, where ``iter_content`` would wait for a whole
    chunk size (or, without chunked encoding, for the end of the body). Every event that
    arrived in one piece is in one item, so that they can leave the gateway together. An
    item may be empty: a read of a chunked body's framing alone.
    """
    raw = response.raw
    body = plain_chunked_body(raw)
    try:
        if body is None:
            while data := raw.read1(READ_SIZE, decode_content=True):
                yield data
            return
        while not body.ended():
            # Yielded unnamed, so that a waiting stream keeps no read it has passed on.
            yield body.data_of_next_read()
    except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
        log.warning("upstream %s went silent mid-stream", response.url)
        raise UpstreamTimeout("The model's upstream stopped sending mid-answer.") from None
    except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
        log.warning("upstream %s: connection lost mid-stream: %s", response.url, exc)
        raise UpstreamError("The connection to the model's upstream was lost.") from None


def plain_chunked_body(raw: urllib3.HTTPResponse) -> ChunkedBody | None:
    """Return a ChunkedBody for ``raw``'s body if it is chunked and not encoded.

    Such a body is decoded here, beneath urllib3 and http.client: their reads add to
    every HTTP chunk a size line's read, a context manager, a decoded-buffer queue and
    byte accounting, most of what relaying one event cost. Any other body (a length,
    none, an encoding to decode) is read through urllib3.
    """
    body, sock = raw._fp, getattr(raw.connection, "sock", None)
    if raw.headers.get("content-encoding") or not getattr(body, "chunked", False) or not sock:
        return None
    return ChunkedBody(body, sock)


class ChunkedBody:
    """Decodes a chunked body from its socket's reads, keeping http.client's state exact.

    The first read takes what http.client's buffer holds (the start of the body, read
    with the head) and swaps that 8 KB buffer, which would otherwise live as long as the
    stream, for one of STREAM_BUFFER_SIZE; every other read is one ``recv`` of the
    socket, which holds no buffer while it waits. A held stream so keeps no read buffer
    at all: with http.client's, it was the largest part of what one costs.

    Between reads, http.client's chunk state (``chunk_left``: the bytes left of the
    chunk being read, 0 while its CRLF is, None at a size line) says where the body
    stands, so that its own read can take the body on (``body_finished``). A read that
    ends inside a size line, a CRLF or the trailer is followed by the next at once: the
    state could not say so, and an upstream writes a chunk's framing with its data. The
    body's end, trailer included, closes the response as http.client does, which lets
    the connection go back to its pool.
    """

    def __init__(self, response: http.client.HTTPResponse, sock: socket.socket) -> None:
        self.response = response
        self.sock = sock
        self.buffered = True
        self.left: int | None = response.chunk_left
        # Trailer lines read, once the last chunk's size line was: None before.
        self.trailer_lines: int | None = None
        self.cut = b""

    def ended(self) -> bool:
        """Tell whether the body's end was read."""
        return self.response.isclosed()

    def data_of_next_read(self) -> bytes:
        """Read on until the state is whole again; return the chunk data read."""
        pieces: list[bytes] = []
        while True:
            read = self._read()
            pieces.append(self._take(self.cut + read if self.cut else read))
            if self.ended() or not (self.cut or self.trailer_lines is not None):
                break
            if len(self.cut) > MAX_FRAMING_LINE:
                raise http.client.LineTooLong("chunk size or trailer line")
            if (self.trailer_lines or 0) > MAX_TRAILER_LINES:
                raise http.client.HTTPException("more than 100 trailer lines")
        self.response.chunk_left = self.left
        return b"".join(pieces)

    def _read(self) -> bytes:
        if self.buffered:
            fp = self.response.fp
            # http.client's file buffers io.DEFAULT_BUFFER_SIZE: read1 takes all it
            # holds, or, if it holds nothing, reads the socket once.
            read = fp.read1(io.DEFAULT_BUFFER_SIZE)
            self.response.fp = io.BufferedReader(fp.detach(), STREAM_BUFFER_SIZE)
            self.buffered = False
        else:
            read = self.sock.recv(READ_SIZE)
        if not read:
            raise http.client.IncompleteRead(b"")
        return read

    def _take(self, buffer: bytes) -> bytes:
        """Consume ``buffer``; return its chunk data; keep a line it cuts in ``cut``."""
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
                self.trailer_lines += 1
                if not line.strip():
                    # The body's end: what may follow is not this response's.
                    self.response._close_conn()
                    position = end
            elif (left := chunk_size(line)) == 0:
                self.trailer_lines, left = 0, None
        self.cut, self.left = buffer[position:], left
        return b"".join(pieces)


def chunk_size(line: bytes) -> int:
    """Return the size a chunk's size line gives; raise IncompleteRead if it gives none."""
    try:
        size = int(line.partition(b";")[0], 16)
    except ValueError:
        size = -1
    if size < 0:
        raise http.client.IncompleteRead(b"")
    return size


def release_response(response: requests.Response, *, complete: bool) -> None:
    """Put a streamed response's connection back in the pool, or close it.

    A stream read to its last event goes back to the pool once the body's end is read,
    so the next request skips a TCP and TLS handshake. Any other is closed at once, which
    is also how an upstream learns to stop generating for a caller that went away.
    """
    if complete and body_finished(response.raw):
        response.raw.release_conn()
    else:
        response.close()


def body_finished(raw: urllib3.HTTPResponse) -> bool:
    """Read what is left of a body after its last event; False if it does not end soon."""
    sock = getattr(raw.connection, "sock", None)
    if sock is not None:
        # Only the body's end (a zero-length chunk) is left, normally already here; a
        # server holding the stream open is not waited for. A reused connection gets
        # its timeout back with its next request.
        sock.settimeout(BODY_END_SECONDS)
    try:
        while raw.read1(READ_SIZE, decode_content=True):
            pass
    except (urllib3.exceptions.HTTPError, OSError):
        return False
    return raw.isclosed()


def transport_error(exc: requests.RequestException) -> UpstreamError:
    """Map a failed call (refused, reset, timed out) to the gateway's error."""
    timeouts = (requests.Timeout, urllib3.exceptions.TimeoutError)
    if isinstance(exc, requests.Timeout) or any(isinstance(a, timeouts) for a in exc.args):
        return UpstreamTimeout()
    if isinstance(exc, requests.ConnectionError):
        return UpstreamUnavailable()
    return UpstreamError()


class HttpUpstreamAdapter(Adapter):
    """Base of the adapters that call their upstream over HTTP.

    Upstream options: ``pool_size`` (keep-alive connections kept, default 100),
    ``tokenizer`` (the encoding that counts tokens when the upstream does not, default
    cl100k_base; a model may name its own) and ``image_tokens`` (what one image is
    assumed to cost in a hold, default 1600).
    """

    # How many of the upstream's tokens one counted token is, for models whose tokenizer
    # is not public and runs above cl100k_base.
    token_ratio: ClassVar[float] = 1.0
    # What a ``detail: low`` image costs, on upstreams that honour ``detail`` (OpenAI's
    # protocol does); None on those that bill every image in full.
    low_detail_image_tokens: ClassVar[int | None] = LOW_DETAIL_IMAGE_TOKENS

    def __init__(self, upstream: UpstreamConfig) -> None:
        super().__init__(upstream)
        options = upstream.options
        self.pool = open_pool(positive_int_option(options, "pool_size", DEFAULT_POOL_SIZE))
        # The headers a session would add: requests' User-Agent, Accept and
        # Accept-Encoding (an upstream may compress; bodies are decoded as they are read).
        self.default_headers = dict(requests.utils.default_headers())
        self.timeout = (upstream.connect_timeout, upstream.read_timeout)
        self.image_tokens = positive_int_option(options, "image_tokens", DEFAULT_IMAGE_TOKENS)
        self.tokenizer = encoding_option(options.get("tokenizer", DEFAULT_ENCODING), "tokenizer")
        # Loaded at start, so that the first request a worker serves does not pay for it.
        encoding_named(self.tokenizer)

    def api_key(self) -> str | None:
        """Return the upstream's key from the environment; None when it needs none."""
        name = self.upstream.api_key_env
        if not name:
            return None
        key = os.environ.get(name)
        if not key:
            log.error("upstream %s: environment variable %s is not set", self.upstream.name, name)
            raise UpstreamMisconfigured()
        return key

    def post(
        self,
        url: str,
        body: dict[str, Any],
        headers: dict[str, str],
        *,
        stream: bool,
        public_model: str,
    ) -> requests.Response:
        """POST ``body`` as JSON; return the response once its status is a success.

        ``url`` is in prepared form (``prepared_url``). ``public_model`` replaces the
        upstream's name for the model in a passed-on message.
        """
        headers = {**self.default_headers, **headers}
        if request_id := current_request_id():
            headers[REQUEST_ID_HEADER] = request_id
        prepared = prepared_post(url, dumps(body), headers)
        try:
            response = self.pool.send(prepared, stream=stream, timeout=self.timeout)
            if not stream:
                response.content  # noqa: B018 - reads the body while errors are still caught
        except requests.RequestException as exc:
            log.warning("upstream %s: %s", self.upstream.name, exc)
            raise transport_error(exc) from None
        if response.status_code >= 300:
            with response:
                error = self.status_error(response, (str(body.get("model")), public_model))
            if isinstance(error, UpstreamError):
                error.upstream_status = response.status_code
            raise error
        # A streamed response lives as long as the answer: it need not keep what was
        # sent (the body and its headers), thousands of times over.
        response.request = None
        return response

    def read_json(self, response: requests.Response) -> dict[str, Any]:
        """Read and decode a whole JSON body; raise UpstreamError when it is not one."""
        try:
            body = loads(response.content)
        except requests.RequestException as exc:
            raise transport_error(exc) from None
        except ValueError:
            body = None
        if not isinstance(body, dict):
            log.warning("upstream %s: answered something other than JSON", self.upstream.name)
            raise UpstreamError()
        return body

    def status_error(self, response: requests.Response, names: tuple[str, str]) -> Exception:
        """Map an upstream's error status to the gateway's error."""
        status, name = response.status_code, self.upstream.name
        retry_after = retry_after_seconds(response.headers)
        if status < 400:
            # Redirects are not followed: an API that redirects has moved, or base_url is wrong.
            log.error("upstream %s redirected the gateway (%d): check its base_url", name, status)
            return UpstreamMisconfigured()
        if status in REJECTED:
            return self.rejection(response, names)
        if status in OVERLOADED:
            log.warning("upstream %s answered %d (retry after %s)", name, status, retry_after)
            return UpstreamUnavailable(retry_after=retry_after)
        if status in TIMED_OUT:
            return UpstreamTimeout(retry_after=retry_after)
        if 400 <= status < 500:
            # 401/403/404: a wrong key, base_url or model name. Its text may quote the key.
            log.error("upstream %s refused the gateway with %d: check its key", name, status)
            return UpstreamMisconfigured()
        log.warning("upstream %s answered %d", name, status)
        return UpstreamError(retry_after=retry_after)

    def rejection(self, response: requests.Response, names: tuple[str, str]) -> UpstreamRejected:
        """Pass the upstream's 400 message on, its name for the model replaced by ours."""
        try:
            message, param = upstream_error_message(loads(response.content))
        except (ValueError, requests.RequestException):
            message, param = None, None
        message = (message or "The model's upstream rejected the request.")[:MAX_MESSAGE_CHARACTERS]
        upstream_model, public_model = names
        if upstream_model:
            message = message.replace(upstream_model, public_model)
        return UpstreamRejected(message, param=param)

    def count_prompt_tokens(
        self, request: ChatRequest, target: RouteTarget, *, limit: int | None = None
    ) -> int:
        """Estimate the prompt tokens of ``request``, on the high side (see Adapter)."""
        encoding = encoding_named(target.tokenizer or self.tokenizer)
        tokens = estimate_prompt_tokens(
            request,
            encoding,
            image_tokens=self.image_tokens,
            low_detail_image_tokens=self.low_detail_image_tokens,
            limit=None if limit is None else math.ceil(limit / self.token_ratio),
        )
        return math.ceil(tokens * self.token_ratio)

    def prompt_token_bound(self, request: ChatRequest, target: RouteTarget) -> int:
        """Bound the prompt tokens by the prompt's UTF-8 size, without tokenizing it."""
        tokens = prompt_token_bound(
            request,
            image_tokens=self.image_tokens,
            low_detail_image_tokens=self.low_detail_image_tokens,
        )
        return math.ceil(tokens * self.token_ratio)

    def count_text_tokens(self, text: str, target: RouteTarget) -> int:
        """Count the tokens of generated text."""
        encoding = encoding_named(target.tokenizer or self.tokenizer)
        return round(count_text(text, encoding) * self.token_ratio)


def positive_int_option(options: Mapping[str, Any], key: str, default: int) -> int:
    """Read a positive integer option; raise ValueError naming it otherwise."""
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{key} must be a positive integer")
    return value


def encoding_option(value: Any, key: str) -> str:
    """Check that ``value`` names an encoding bpe-openai ships; raise ValueError otherwise."""
    if value not in encoding_names():
        raise ValueError(f"{key} must be one of {', '.join(encoding_names())}")
    return value
