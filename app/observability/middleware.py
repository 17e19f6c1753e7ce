"""The WSGI layer that sees every request whole: ids, proxies, timing, access line, metrics.

It sits outside Flask, so 404s, 405s, rate-limited requests and streams all pass through
it: each gets an ``X-Request-Id``, one access line and its metrics when its last byte has
been written (for a stream: when the stream is closed, settlement included).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from werkzeug.middleware.proxy_fix import ProxyFix

from app.observability import metrics
from app.observability.logs import log_access
from app.observability.trace import (
    REQUEST_ID_HEADER,
    RequestTrace,
    accept_request_id,
    close_trace,
    open_trace,
)

log = logging.getLogger(__name__)
OVERHEAD_HEADER = "X-Gateway-Overhead-Ms"
EVENT_STREAM = "text/event-stream"
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class TrustedProxies:
    """Read the caller's address from ``X-Forwarded-For`` only behind a trusted proxy.

    ``hops`` proxies (nginx, a platform's router) are trusted, and only on requests that
    arrive from an address in ``allowed`` (FORWARDED_ALLOW_IPS; ``*`` for any): a caller
    reaching the app directly cannot choose the address that rate limits and logs see.
    """

    def __init__(self, app: WSGIApp, *, hops: int, allowed: str) -> None:
        self.app = app
        self.fixed = ProxyFix(app, x_for=hops, x_proto=hops, x_host=0) if hops else None
        addresses = {address.strip() for address in allowed.split(",") if address.strip()}
        self.any_address = "*" in addresses
        self.addresses = frozenset(addresses)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        """Serve the request, its address taken from the trusted proxies' headers."""
        if self.fixed is not None and (
            self.any_address or environ.get("REMOTE_ADDR") in self.addresses
        ):
            return self.fixed(environ, start_response)
        return self.app(environ, start_response)


class RequestObserver:
    """Opens each request's trace, stamps its headers, and closes it with a log line."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        """Serve the request under its trace."""
        trace = open_trace(accept_request_id(environ.get("HTTP_X_REQUEST_ID")))
        trace.method = environ.get("REQUEST_METHOD", "")
        trace.path = environ.get("PATH_INFO", "")

        def traced_start_response(status: str, headers: list, exc_info: Any = None) -> Any:
            trace.status = int(status[:3])
            trace.first_byte_seconds = trace.elapsed()
            stamp_headers(trace, headers)
            return start_response(status, headers, exc_info)

        try:
            body = self.app(environ, traced_start_response)
        except BaseException:
            trace.status = trace.status or 500
            finish_request(trace, environ)
            raise
        return TracedBody(body, lambda: finish_request(trace, environ))


def stamp_headers(trace: RequestTrace, headers: list[tuple[str, str]]) -> None:
    """Add the request id to the response and, to a stream's, count the stream open."""
    headers.append((REQUEST_ID_HEADER, trace.request_id))
    trace.streamed = any(
        name.lower() == "content-type" and value.startswith(EVENT_STREAM) for name, value in headers
    )
    trace.overhead = trace.overhead_seconds()
    headers.append((OVERHEAD_HEADER, f"{trace.overhead * 1000:.1f}"))
    if trace.streamed:
        metrics.streams_in_flight.inc()


def finish_request(trace: RequestTrace, environ: dict[str, Any]) -> None:
    """Write the request's access line and metrics; never fail the request over them."""
    close_trace(trace)
    trace.client = environ.get("REMOTE_ADDR")
    if trace.streamed:
        metrics.streams_in_flight.dec()
    try:
        log_access(trace)
        metrics.observe_request(trace)
    except Exception:
        log.exception("could not record the request's access line and metrics")


class TracedBody:
    """A response body that finishes its request's trace once it is closed."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None]) -> None:
        self.body = body
        self.on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        """Yield the body's pieces."""
        return iter(self.body)

    def close(self) -> None:
        """Close the body (a stream settles here), then finish the trace."""
        try:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()
        finally:
            self.on_close()
