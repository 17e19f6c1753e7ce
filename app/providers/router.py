"""Run a request on a model's routes in order: retry with backoff, then fail over.

A route is abandoned only before the caller has received anything from it; once a
stream has yielded its first chunk, a failure ends the stream (the gateway writes it
as an error event) instead of being retried elsewhere. An upstream that asks to be left
alone for longer than MAX_RETRY_AFTER_SECONDS is not waited for: the next route is tried.
An upstream in its cooldown (see cooldown.py) is skipped without a call; a request that
gave up on an upstream (its retries spent, or a failure retrying cannot help) counts one
failure towards the cooldown, and a request it answered resets the count.

Every call is noted on the request's trace: the upstream, how it ended (ok, retried,
failed_over, failed, timeout, 5xx, rejected; skipped for a cooldown) and how long the
gateway waited for it, for the generation record, the metrics and the overhead header.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from app.observability.trace import (
    FAILED_OVER,
    OK,
    RETRIED,
    SERVER_ERROR,
    TIMEOUT,
    RequestTrace,
    current_trace,
)
from app.providers.base import (
    ChatRequest,
    Chunk,
    Completion,
    EmbeddingRequest,
    Embeddings,
    NativeAnswer,
    NativeCall,
    Route,
)
from app.providers.cooldown import Admission, upstream_cooldowns
from app.providers.errors import (
    UpstreamError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
BACKOFF_BASE_SECONDS = 0.2
BACKOFF_CAP_SECONDS = 2.0
MAX_RETRY_AFTER_SECONDS = 5.0
FAILED, REJECTED, SKIPPED = "failed", "rejected", "skipped"


def backoff_delay(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): capped exponential, jittered."""
    ceiling = min(BACKOFF_CAP_SECONDS, BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
    return random.uniform(ceiling / 2, ceiling)


def retry_delay(error: UpstreamError, attempt: int) -> float | None:
    """Seconds to wait before trying the same route again after ``error``; None: move on."""
    if not error.retryable:
        return None
    if error.retry_after is None:
        return backoff_delay(attempt)
    return error.retry_after if error.retry_after <= MAX_RETRY_AFTER_SECONDS else None


def failure_outcome(error: UpstreamError, *, retrying: bool, last_route: bool) -> str:
    """Name how a failed call ended: timeout, 5xx, or what the router did next."""
    if isinstance(error, UpstreamTimeout):
        return TIMEOUT
    if (error.upstream_status or 0) >= 500:
        return SERVER_ERROR
    if retrying:
        return RETRIED
    return FAILED if last_route else FAILED_OVER


class RouteRunner:
    """Runs one request's calls on a route, noting each on the trace and the cooldowns."""

    def __init__(self, route: Route, trace: RequestTrace, *, last_route: bool) -> None:
        self.route = route
        self.upstream = route.adapter.upstream
        self.trace = trace
        self.last_route = last_route

    def run(self, attempt: Callable[[Route], T]) -> T:
        """Call the route, retrying as its upstream allows; raise its last UpstreamError."""
        admission = upstream_cooldowns.admit(self.upstream)
        if not admission.allowed:
            self.trace.note_attempt(self.upstream.name, SKIPPED, 0.0)
            raise UpstreamUnavailable()
        tries = max(self.upstream.retries, 0) + 1
        try_number = 1
        while True:
            started = time.perf_counter()
            try:
                result = attempt(self.route)
            except UpstreamRejected:
                # The upstream is up; it refused the request itself.
                self.trace.note_attempt(self.upstream.name, REJECTED, _since(started))
                self.note_success(admission)
                raise
            except UpstreamError as error:
                delay = retry_delay(error, try_number) if try_number < tries else None
                self.note_failure(error, started, try_number, retrying=delay is not None)
                if delay is None:
                    # The route failed this request, retries included: one in a row.
                    upstream_cooldowns.note_failure(self.upstream)
                    raise
            else:
                self.trace.note_attempt(self.upstream.name, OK, _since(started))
                self.note_success(admission)
                return result
            time.sleep(delay)
            self.trace.note_waiting(delay)
            try_number += 1

    def note_success(self, admission: Admission) -> None:
        """Reset the upstream's failures in a row, if it had any."""
        upstream_cooldowns.note_success(self.upstream, after_failures=admission.failures > 0)

    def note_failure(
        self, error: UpstreamError, started: float, try_number: int, *, retrying: bool
    ) -> None:
        """Log, trace and count one failed call."""
        tries = max(self.upstream.retries, 0) + 1
        name = self.upstream.name
        log.warning("upstream %s failed (%s), try %d of %d", name, error.code, try_number, tries)
        outcome = failure_outcome(error, retrying=retrying, last_route=self.last_route)
        self.trace.note_attempt(self.upstream.name, outcome, _since(started))


def _since(started: float) -> float:
    return time.perf_counter() - started


def _on_routes(
    routes: Sequence[Route], attempt: Callable[[Route], T], trace: RequestTrace | None
) -> T:
    trace = trace or current_trace()
    last_error: UpstreamError | None = None
    for index, route in enumerate(routes):
        runner = RouteRunner(route, trace, last_route=index == len(routes) - 1)
        try:
            return runner.run(attempt)
        except UpstreamError as error:
            last_error = error
    if last_error is not None and len(routes) == 1:
        raise last_error
    raise UpstreamUnavailable()


def complete_on_routes(
    routes: Sequence[Route], request: ChatRequest, trace: RequestTrace | None = None
) -> Completion:
    """Return the first route's answer that succeeds; raise the last UpstreamError."""
    return _on_routes(routes, lambda route: route.adapter.complete(request, route.target), trace)


def embed_on_routes(
    routes: Sequence[Route], request: EmbeddingRequest, trace: RequestTrace | None = None
) -> Embeddings:
    """Return the vectors of the first route that answers; raise the last UpstreamError."""
    return _on_routes(routes, lambda route: route.adapter.embed(request, route.target), trace)


def stream_on_routes(
    routes: Sequence[Route], request: ChatRequest, trace: RequestTrace | None = None
) -> Iterator[Chunk]:
    """Yield the chunks of the first route whose stream starts; raise if none does."""
    return _stream_on_routes(
        routes, lambda route: route.adapter.stream(request, route.target), trace
    )


def relay_on_routes(
    routes: Sequence[Route], call: NativeCall, trace: RequestTrace | None = None
) -> NativeAnswer:
    """Pass ``call`` through whole on the first route that answers; raise the last error."""
    return _on_routes(routes, lambda route: route.adapter.relay(call, route.target), trace)


def relay_stream_on_routes(
    routes: Sequence[Route], call: NativeCall, trace: RequestTrace | None = None
) -> Iterator[bytes]:
    """Yield the bytes of the first route whose passed-through stream starts."""
    return _stream_on_routes(
        routes, lambda route: route.adapter.relay_stream(call, route.target), trace
    )


def _stream_on_routes(
    routes: Sequence[Route],
    open_stream: Callable[[Route], Iterator[T]],
    trace: RequestTrace | None,
) -> Iterator[T]:
    def start(route: Route) -> tuple[T, Iterator[T]]:
        items = open_stream(route)
        try:
            return next(items), items
        except StopIteration:
            raise UpstreamError("The upstream closed the stream without an answer.") from None

    first, rest = _on_routes(routes, start, trace)
    try:
        yield first
        del first  # a waiting stream keeps no chunk it has passed on
        yield from rest
    finally:
        close = getattr(rest, "close", None)
        if close is not None:
            close()
