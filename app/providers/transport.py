"""Reaching an upstream over HTTP, and its failures in the gateway's terms.

Each upstream gets one pool of keep-alive connections (app/providers/http1.py), sized
for a gevent worker's many concurrent requests. A call writes its request there in one
write and reads the answer off the socket: no ``requests.Session`` (merging settings,
proxies and .netrc from the environment, a cookie jar shared by all callers, redirects,
hooks: none of which a JSON API needs), no cookie jar filled from an upstream's
``Set-Cookie``, nothing of requests' or urllib3's internals. The API key is read from
the environment variable the catalog names, when a request needs it, so a catalog loads
(and ``flask catalog list`` works) without the keys. Nothing here puts a key, an
upstream's address or its own error text for a 401/403 into a message a caller can see.
"""

from __future__ import annotations

import http.client
import logging
import math
import os
import time
import zlib
from collections.abc import Iterator, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar

import requests.utils
import urllib3.exceptions

from app.encoding import dumps, loads
from app.observability.trace import REQUEST_ID_HEADER, current_request_id
from app.providers.base import (
    Adapter,
    ChatRequest,
    NativeAnswer,
    NativeCall,
    PromptContent,
    RouteTarget,
    UpstreamConfig,
)
from app.providers.errors import (
    UpstreamError,
    UpstreamMisconfigured,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from app.providers.http1 import (
    ACCEPT_ENCODING,
    UpstreamPool,
    UpstreamResponse,
    normalized_url,
)
from app.providers.tokens import (
    DEFAULT_ENCODING,
    DEFAULT_IMAGE_TOKENS,
    LOW_DETAIL_IMAGE_TOKENS,
    content_token_bound,
    count_content,
    count_text,
    encoding_named,
    encoding_names,
    estimate_prompt_tokens,
    prompt_token_bound,
)

log = logging.getLogger(__name__)

DEFAULT_POOL_SIZE = 100
BODY_END_SECONDS = 0.1
MAX_MESSAGE_CHARACTERS = 1_000
REJECTED = frozenset({400, 413, 422})
OVERLOADED = frozenset({429, 503, 529})
TIMED_OUT = frozenset({408, 504})
# What a failed exchange raises: the socket's errors (timeouts among them, and TLS's),
# urllib3's while connecting, http.client's for a malformed answer, zlib's for a body
# that does not decode.
EXCHANGE_ERRORS = (OSError, urllib3.exceptions.HTTPError, http.client.HTTPException, zlib.error)


def as_count(value: Any) -> int:
    """Return a token count from an upstream's usage, 0 when absent or not a count."""
    return value if type(value) is int and value > 0 else 0


def open_pool(pool_size: int) -> UpstreamPool:
    """Return a transport keeping up to ``pool_size`` keep-alive connections, no retries."""
    return UpstreamPool(pool_size)


def prepared_url(url: str) -> str:
    """Return ``url`` normalised as it is sent (lower-cased host, quoted path)."""
    return normalized_url(url)


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


def received_chunks(response: UpstreamResponse) -> Iterator[bytes]:
    """Yield a streamed body's bytes as they arrive: each item is all that one wait brought.

    A read hands over what the socket has, where reading by a size would wait for it
    (or, without chunked encoding, for the end of the body). Every event that arrived
    in one piece is in one item, so that they can leave the gateway together. An item
    may be empty: a read of a chunked body's framing alone.
    """
    try:
        while not response.ended:
            # Yielded unnamed, so that a waiting stream keeps no read it has passed on.
            yield response.read1()
    except TimeoutError:
        log.warning("upstream %s went silent mid-stream", response.origin)
        raise UpstreamTimeout("The model's upstream stopped sending mid-answer.") from None
    except EXCHANGE_ERRORS as exc:
        log.warning("upstream %s: connection lost mid-stream: %s", response.origin, exc)
        raise UpstreamError("The connection to the model's upstream was lost.") from None


def release_response(response: UpstreamResponse, *, complete: bool) -> None:
    """Put a streamed response's connection back in the pool, or close it.

    A stream read to its last event goes back to the pool once the body's end is read,
    so the next request skips a TCP and TLS handshake. Any other is closed at once, which
    is also how an upstream learns to stop generating for a caller that went away.
    """
    if complete and body_finished(response):
        response.release()
    else:
        response.close()


def body_finished(response: UpstreamResponse) -> bool:
    """Read what is left of a body after its last event; False if it does not end soon."""
    if response.ended:
        return True
    # Only the body's end (a zero-length chunk) is left, normally already here; a
    # server holding the stream open is not waited for. A reused connection gets its
    # timeout back with its next request.
    response.sock.settimeout(BODY_END_SECONDS)
    deadline = time.monotonic() + BODY_END_SECONDS
    try:
        while not response.ended and time.monotonic() < deadline:
            response.read1()
    except EXCHANGE_ERRORS:
        return False
    return response.ended


def exchange_error(exc: Exception, *, answered: bool) -> UpstreamError:
    """Map a failed exchange to the gateway's error: before the answer's head, or after it.

    A timeout is the upstream's, connecting or reading. Any other failure before the head
    (refused, reset, a TLS or protocol error) leaves the upstream unreachable; after it,
    the answer broke off.
    """
    connect_timeout = isinstance(exc, urllib3.exceptions.ConnectTimeoutError) and not isinstance(
        exc, urllib3.exceptions.NewConnectionError
    )
    if connect_timeout or isinstance(exc, TimeoutError):
        return UpstreamTimeout()
    return UpstreamError() if answered else UpstreamUnavailable()


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
        # The headers a session would add: requests' User-Agent and Accept, and an
        # Accept-Encoding naming what the body's reads are decoded from (requests' too).
        self.default_headers = {
            **requests.utils.default_headers(),
            "Accept-Encoding": ACCEPT_ENCODING,
        }
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
        upstream_model: str | None = None,
    ) -> UpstreamResponse:
        """POST ``body`` as JSON; return the response once its status is a success.

        ``url`` is in prepared form (``prepared_url``). A whole answer's body is read
        before the return (``content``), a stream's is left to read. ``public_model``
        replaces the upstream's name for the model in a passed-on message: the body's
        ``model``, or ``upstream_model`` for a protocol that names it in the path.
        """
        headers = {**self.default_headers, **headers}
        if request_id := current_request_id():
            headers[REQUEST_ID_HEADER] = request_id
        response = self.exchange(url, dumps(body), headers, stream=stream)
        if response.status >= 300:
            try:
                named = upstream_model or str(body.get("model"))
                error = self.status_error(response, (named, public_model))
            finally:
                response.close()
            if isinstance(error, UpstreamError):
                error.upstream_status = response.status
            raise error
        return response

    def exchange(
        self, url: str, body: bytes, headers: dict[str, str], *, stream: bool
    ) -> UpstreamResponse:
        """Send the request; return its answer, whole unless ``stream``, or raise UpstreamError."""
        answered = False
        try:
            response = self.pool.post(url, body, headers, self.timeout)
            answered = True
            if not stream:
                response.read()
        except EXCHANGE_ERRORS as exc:
            log.warning("upstream %s: %s", self.upstream.name, exc)
            raise exchange_error(exc, answered=answered) from None
        return response

    # Where each protocol the upstream speaks natively is served, below its base_url.
    native_paths: ClassVar[Mapping[str, str]] = {}
    # The caller's headers a request passed through takes on (its protocol's version...).
    passed_on_headers: ClassVar[tuple[str, ...]] = ()

    def headers(self) -> dict[str, str]:
        """Return the headers of every request to the upstream (its key, its protocol's)."""
        return {"Content-Type": "application/json"}

    def relay(self, call: NativeCall, target: RouteTarget) -> NativeAnswer:
        """Pass ``call`` through whole: the caller's body, the route's name for its model.

        An answer that is not a JSON object is returned undecoded, not raised: the
        upstream answered, and may have billed it, so it is not tried again.
        """
        response = self.post_native(call, target, stream=False)
        body = response.content or b""
        try:
            decoded = loads(body)
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            log.warning("upstream %s: answered something other than JSON", self.upstream.name)
            decoded = None
        return NativeAnswer(body=body, decoded=decoded)

    def relay_stream(self, call: NativeCall, target: RouteTarget) -> Iterator[bytes]:
        """Pass ``call`` through streamed: yield the upstream's bytes as each read brings them."""
        response = self.post_native(call, target, stream=True)
        complete = False
        try:
            yield from received_chunks(response)
            complete = True
        finally:
            # Also when the caller went away: closing drops the connection, which stops
            # the upstream generating (and charging for) tokens nobody will read.
            release_response(response, complete=complete)

    def post_native(
        self, call: NativeCall, target: RouteTarget, *, stream: bool
    ) -> UpstreamResponse:
        """Send ``call`` to its protocol's path: the caller's body, the route's model in it."""
        base = (self.upstream.base_url or "").rstrip("/")
        headers = self.headers()
        for name in self.passed_on_headers:
            if value := call.headers.get(name):
                headers[name] = value
        return self.post(
            prepared_url(base + self.native_paths[call.api]),
            {**call.body, "model": target.upstream_model},
            headers,
            stream=stream,
            public_model=str(call.body.get("model")),
        )

    def read_json(self, response: UpstreamResponse) -> dict[str, Any]:
        """Decode a whole JSON body; raise UpstreamError when it is not one."""
        try:
            body = loads(response.content or b"")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            log.warning("upstream %s: answered something other than JSON", self.upstream.name)
            raise UpstreamError()
        return body

    def status_error(self, response: UpstreamResponse, names: tuple[str, str]) -> Exception:
        """Map an upstream's error status to the gateway's error."""
        status, name = response.status, self.upstream.name
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

    def rejection(self, response: UpstreamResponse, names: tuple[str, str]) -> UpstreamRejected:
        """Pass the upstream's 400 message on, its name for the model replaced by ours."""
        try:
            # A stream's error body is read here, the whole answer's already was.
            message, param = upstream_error_message(loads(response.read()))
        except (ValueError, *EXCHANGE_ERRORS):
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

    def count_content_tokens(
        self, content: PromptContent, target: RouteTarget, *, limit: int | None = None
    ) -> int:
        """Count a passed-through prompt's texts and images, on the high side (see Adapter)."""
        encoding = encoding_named(target.tokenizer or self.tokenizer)
        tokens = count_content(
            content,
            encoding,
            image_tokens=self.image_tokens,
            low_detail_image_tokens=self.low_detail_image_tokens,
            limit=None if limit is None else math.ceil(limit / self.token_ratio),
        )
        return math.ceil(tokens * self.token_ratio)

    def content_token_bound(self, content: PromptContent, target: RouteTarget) -> int:
        """Bound a passed-through prompt's tokens by its texts' UTF-8 size, without tokenizing."""
        tokens = content_token_bound(
            content,
            image_tokens=self.image_tokens,
            low_detail_image_tokens=self.low_detail_image_tokens,
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
        """Count the tokens of generated text, rounded up: an estimate never bills less."""
        encoding = encoding_named(target.tokenizer or self.tokenizer)
        return math.ceil(count_text(text, encoding) * self.token_ratio)


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
