"""The one Server-Sent Events writer: frames chunk bodies as ``data:`` events.

Errors before the first event are raised to the view, which answers them with a status
and the envelope; after it, the status is spent, so an error becomes one more event in
the envelope shape, followed by ``[DONE]`` like any stream's end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from flask import Response, stream_with_context

from app.encoding import dumps
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
    return b"data: " + dumps(body) + b"\n\n"


def start_stream(chunks: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Pull the first chunk now, so that failures before any byte raise to the view."""
    first = next(chunks, _END)

    def resumed() -> Iterator[dict[str, Any]]:
        if first is not _END:
            yield first
        yield from chunks

    return resumed()


def write_events(chunks: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """Frame ``chunks`` as events, end with ``[DONE]``, and close ``chunks`` however it ends."""
    try:
        try:
            for chunk in chunks:
                yield frame(chunk)
        except APIError as error:
            current_trace().error_code = error.code
            yield frame(error.to_envelope())
        except Exception:
            log.exception("stream failed after it started")
            current_trace().error_code = "server_error"
            yield frame(APIError(code="server_error").to_envelope())
        yield DONE
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


def event_stream_response(chunks: Iterator[dict[str, Any]]) -> Response:
    """Stream ``chunks`` as a response, with the headers that keep proxies from buffering."""
    return Response(
        stream_with_context(write_events(start_stream(chunks))),
        mimetype="text/event-stream",
        headers=STREAM_HEADERS,
    )
