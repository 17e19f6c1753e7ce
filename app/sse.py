"""The one Server-Sent Events writer: every door's events, framed as the door says.

The events of one upstream read leave in one piece of the body, one socket send; an
event never waits for a later read.

Errors before the first event are raised to the view, which answers them with a status
and its door's envelope; after it, the status is spent, so an error becomes the events
the door ends a broken stream with (its ``Framing``), and the stream closes as any does.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from flask import Flask, Response, current_app

from app.encoding import dumps_transient
from app.errors import APIError
from app.observability.trace import current_trace

log = logging.getLogger(__name__)

STREAM_HEADERS = {
    "Cache-Control": "no-cache",
    # nginx buffers proxied responses unless told not to, which would hold every token.
    "X-Accel-Buffering": "no",
}


def data_event(body: dict[str, Any]) -> bytes:
    """Encode one event as its data line alone."""
    return b"data: " + dumps_transient(body) + b"\n\n"


def typed_event(body: dict[str, Any]) -> bytes:
    """Encode one event named by its body's ``type``, as OpenAI's Responses and Anthropic's."""
    return _event_line(body["type"]) + dumps_transient(body) + b"\n\n"


def typed_events(bodies: list[dict[str, Any]]) -> bytes:
    """Encode events a door hands over together (one list per upstream read), each typed."""
    return b"".join(
        [_event_line(body["type"]) + dumps_transient(body) + b"\n\n" for body in bodies]
    )


def written_event(name: str, data: bytes) -> bytes:
    """Frame an upstream's event under its own name, its data as given: a door passing it on."""
    return b"event: %s\ndata: %s\n\n" % (name.encode(), data)


@functools.cache
def _event_line(kind: str) -> bytes:
    # Event types are a door's own few names, never a caller's: one line each is kept.
    return b"event: " + kind.encode() + b"\ndata: "


# What a door's stream hands the writer: one event's body, or a list of bodies the door
# frames together (the events of one upstream read); a None is a flush point.
Events = dict[str, Any] | list[dict[str, Any]]


@dataclass(frozen=True)
class Framing:
    """How a door writes its events: each body, the end of a stream broken by an error, the end.

    ``error`` may keep state of its door's stream (sequence numbers, an id): it is given
    the error and returns every event that ends the stream.
    """

    frame: Callable[[Any], bytes]
    error: Callable[[APIError], bytes]
    end: bytes = b""


def event_stream_response(chunks: Iterator[Events | None], framing: Framing) -> Response:
    """Stream ``chunks`` as a response, with the headers that keep proxies from buffering.

    The first chunk is pulled here, so that failures before any byte raise to the view.
    """
    first = first_chunk(chunks)
    return Response(
        write_events(chunks, framing, first, current_app._get_current_object()),
        mimetype="text/event-stream",
        headers=STREAM_HEADERS,
        # The events are bytes already: werkzeug's encoding of each would only add two
        # levels of iteration to every held stream's stack.
        direct_passthrough=True,
    )


def first_chunk(chunks: Iterator[Events | None]) -> Events | None:
    """Return the first chunk of ``chunks``, or None if they end without one."""
    for chunk in chunks:
        # A None only says that the next chunk may wait: it does not start the stream.
        if chunk is not None:
            return chunk
    return None


def write_events(
    chunks: Iterator[Events | None],
    framing: Framing,
    first: Events | None = None,
    app: Flask | None = None,
) -> Iterator[bytes]:
    """Frame ``first``, then ``chunks``, as events; end as the framing says; close ``chunks``.

    The first event goes out at once: it starts the caller's answer. The others are
    joined into one item (one socket send) until a None among the chunks says that the
    next may wait, and at the end.

    With ``app``, all of it runs in an app context of its own, once the view has
    returned: what runs as the stream goes (its settlement, at the end or when the
    caller leaves) needs the app and its database session, not the request. Keeping the
    request's context alive instead, as ``stream_with_context`` does, would hold its
    request object, headers and body for as long as the stream lasts, thousands of
    times over; for the same reason nothing already sent stays referenced here.
    """
    frame = framing.frame
    framed = [] if first is None else [frame(first)]
    del first
    started = False
    with nullcontext() if app is None else app.app_context():
        try:
            try:
                if framed:
                    started = True
                    yield framed.pop()
                for chunk in chunks:
                    if chunk is not None:
                        framed.append(frame(chunk))
                    if framed and (chunk is None or not started):
                        started = True
                        yield b"".join(framed)
                        framed.clear()
            except APIError as error:
                current_trace().error_code = error.code
                framed.append(framing.error(error))
            except Exception:
                log.exception("stream failed after it started")
                current_trace().error_code = "server_error"
                framed.append(framing.error(APIError(code="server_error")))
            framed.append(framing.end)
            yield b"".join(framed)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
