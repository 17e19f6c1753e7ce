"""The one Server-Sent Events writer: frames chunk bodies as ``data:`` events.

The events of one upstream read leave in one piece of the body, one socket send; an
event never waits for a later read.

Errors before the first event are raised to the view, which answers them with a status
and the envelope; after it, the status is spent, so an error becomes one more event in
the envelope shape, followed by ``[DONE]`` like any stream's end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from flask import Response, current_app

from app.encoding import dumps_transient
from app.errors import APIError
from app.observability.trace import current_trace

log = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
STREAM_HEADERS = {
    "Cache-Control": "no-cache",
    # nginx buffers proxied responses unless told not to, which would hold every token.
    "X-Accel-Buffering": "no",
}
_END = object()


def frame(body: dict[str, Any]) -> bytes:
    """Encode one event."""
    return b"data: " + dumps_transient(body) + b"\n\n"


def start_stream(chunks: Iterator[dict[str, Any] | None]) -> Iterator[dict[str, Any] | None]:
    """Pull the first chunk now, so that failures before any byte raise to the view."""
    first = next(chunks, _END)
    while first is None:
        # Nothing to send yet: a failure before the first chunk is still the view's.
        first = next(chunks, _END)

    def resumed() -> Iterator[dict[str, Any] | None]:
        if first is not _END:
            yield first
        yield from chunks

    return resumed()


def write_events(chunks: Iterator[dict[str, Any] | None]) -> Iterator[bytes]:
    """Frame ``chunks`` as events, end with ``[DONE]``, and close ``chunks`` however it ends.

    The first event goes out at once: it starts the caller's answer. The others are
    joined into one item (one socket send) until a None among the chunks says that the
    next may wait, and at the end.
    """
    framed: list[bytes] = []
    started = False
    try:
        try:
            for chunk in chunks:
                if chunk is not None:
                    framed.append(frame(chunk))
                if framed and (chunk is None or not started):
                    started = True
                    events = b"".join(framed)
                    framed.clear()
                    yield events
        except APIError as error:
            current_trace().error_code = error.code
            framed.append(frame(error.to_envelope()))
        except Exception:
            log.exception("stream failed after it started")
            current_trace().error_code = "server_error"
            framed.append(frame(APIError(code="server_error").to_envelope()))
        framed.append(DONE)
        yield b"".join(framed)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def event_stream_response(chunks: Iterator[dict[str, Any] | None]) -> Response:
    """Stream ``chunks`` as a response, with the headers that keep proxies from buffering."""
    return Response(
        in_app_context(write_events(start_stream(chunks))),
        mimetype="text/event-stream",
        headers=STREAM_HEADERS,
    )


def in_app_context(body: Iterator[bytes]) -> Iterator[bytes]:
    """Iterate ``body`` in an app context of its own, once the view has returned.

    What runs as the stream goes (its settlement, at the end) needs the app and its
    database session, not the request: keeping the request's context alive instead, as
    ``stream_with_context`` does, would hold its request object, headers and body for
    as long as the stream lasts, thousands of times over.
    """
    app = current_app._get_current_object()

    def iterated() -> Iterator[bytes]:
        with app.app_context():
            yield from body

    return iterated()
