"""Run a request on a model's routes in order: retry with backoff, then fail over.

A route is abandoned only before the caller has received anything from it; once a
stream has yielded its first chunk, a failure ends the stream (the gateway writes it
as an error event) instead of being retried elsewhere. An upstream that asks to be left
alone for longer than MAX_RETRY_AFTER_SECONDS is not waited for: the next route is tried.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from app.providers.base import ChatRequest, Chunk, Completion
from app.providers.errors import UpstreamError, UpstreamUnavailable

if TYPE_CHECKING:
    from app.catalog.registry import Route

log = logging.getLogger(__name__)
T = TypeVar("T")
BACKOFF_BASE_SECONDS = 0.2
BACKOFF_CAP_SECONDS = 2.0
MAX_RETRY_AFTER_SECONDS = 5.0


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


def _on_route(route: Route, attempt: Callable[[Route], T]) -> T:
    tries = max(route.adapter.upstream.retries, 0) + 1
    try_number = 1
    while True:
        try:
            return attempt(route)
        except UpstreamError as error:
            log.warning(
                "upstream %s failed (%s), try %d of %d",
                route.adapter.upstream.name,
                error.code,
                try_number,
                tries,
            )
            delay = retry_delay(error, try_number)
            if delay is None or try_number >= tries:
                raise
        time.sleep(delay)
        try_number += 1


def _on_routes(routes: Sequence[Route], attempt: Callable[[Route], T]) -> T:
    last_error: UpstreamError | None = None
    for route in routes:
        try:
            return _on_route(route, attempt)
        except UpstreamError as error:
            last_error = error
    if last_error is not None and len(routes) == 1:
        raise last_error
    raise UpstreamUnavailable()


def complete_on_routes(routes: Sequence[Route], request: ChatRequest) -> Completion:
    """Return the first route's answer that succeeds; raise the last UpstreamError."""
    return _on_routes(routes, lambda route: route.adapter.complete(request, route.target))


def stream_on_routes(routes: Sequence[Route], request: ChatRequest) -> Iterator[Chunk]:
    """Yield the chunks of the first route whose stream starts; raise if none does."""

    def start(route: Route) -> tuple[Chunk, Iterator[Chunk]]:
        chunks = route.adapter.stream(request, route.target)
        try:
            return next(chunks), chunks
        except StopIteration:
            raise UpstreamError("The upstream closed the stream without an answer.") from None

    first, rest = _on_routes(routes, start)
    try:
        yield first
        yield from rest
    finally:
        close = getattr(rest, "close", None)
        if close is not None:
            close()
