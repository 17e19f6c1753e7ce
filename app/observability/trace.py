"""What the operator sees of one request: its id, who called, what ran upstream, what it cost.

A ``RequestTrace`` is opened by the WSGI middleware for every request and kept in a
context variable (gevent gives each greenlet its own context), so that code deep in a
request (the router, the settlement) can note what it knows without passing it around
and without importing Flask. The middleware reads it once at the end, to write the
access line, the metrics and the ``X-Gateway-Overhead-Ms`` header.
"""

from __future__ import annotations

import re
import secrets
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

REQUEST_ID_HEADER = "X-Request-Id"
# Ids a caller may choose: short, and harmless in a log line or a header.
SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

OK, RETRIED, FAILED_OVER, TIMEOUT, SERVER_ERROR = "ok", "retried", "failed_over", "timeout", "5xx"


def accept_request_id(raw: str | None) -> str:
    """Return the caller's ``X-Request-Id`` when it is a sane token, else a new id."""
    if raw and SANE_REQUEST_ID.fullmatch(raw):
        return raw
    return "req_" + secrets.token_hex(12)


@dataclass
class UpstreamAttempt:
    """One call to an upstream: which, how it ended, and how long it took."""

    upstream: str
    outcome: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Render for a generation record and its lookup."""
        return {
            "upstream": self.upstream,
            "outcome": self.outcome,
            "duration_ms": round(self.seconds * 1000),
        }


@dataclass
class RequestTrace:
    """One request as it is being served; every field is filled by whoever knows it."""

    request_id: str
    started: float = field(default_factory=time.perf_counter)
    method: str = ""
    path: str = ""
    client: str | None = None
    route: str = "unmatched"
    status: int = 0
    error_code: str | None = None
    account_id: int | None = None
    key_id: int | None = None
    model: str | None = None
    # The wire protocol the request came in by: chat, responses or messages.
    api: str | None = None
    generation_id: str | None = None
    usage: Any = None
    cost: Decimal | None = None
    generation_status: str | None = None
    streamed: bool = False
    attempts: list[UpstreamAttempt] = field(default_factory=list)
    upstream_wait: float = 0.0
    first_token_seconds: float | None = None
    first_byte_seconds: float | None = None
    # The gateway's own time until the response headers left (X-Gateway-Overhead-Ms).
    overhead: float | None = None

    @property
    def upstream(self) -> str | None:
        """The upstream that answered, or the last one tried."""
        return self.attempts[-1].upstream if self.attempts else None

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self.started

    def overhead_seconds(self) -> float:
        """Seconds the gateway itself added until the headers (or so far, before them).

        It is the elapsed time minus the time waiting for upstreams; a stream's headers
        leave when its first chunk is in, and the relaying after them is not counted.
        """
        if self.overhead is not None:
            return self.overhead
        return max(self.elapsed() - self.upstream_wait, 0.0)

    def note_attempt(self, upstream: str, outcome: str, seconds: float) -> None:
        """Record one call to an upstream and the time spent waiting for it."""
        self.attempts.append(UpstreamAttempt(upstream, outcome, seconds))
        self.upstream_wait += seconds

    def note_waiting(self, seconds: float) -> None:
        """Count time spent waiting on an upstream outside an attempt (a retry's backoff)."""
        self.upstream_wait += seconds

    def note_first_token(self) -> None:
        """Remember when the first generated token was ready, once."""
        if self.first_token_seconds is None:
            self.first_token_seconds = self.elapsed()

    def note_generation(
        self, *, generation_id: str, model: str, api: str, usage: Any, cost: Decimal, status: str
    ) -> None:
        """Record the settled generation this request produced."""
        self.generation_id, self.model, self.api, self.usage = generation_id, model, api, usage
        self.cost, self.generation_status = cost, status

    def attempts_as_dicts(self) -> list[dict[str, Any]]:
        """Return the upstream attempts, rendered."""
        return [attempt.to_dict() for attempt in self.attempts]


_current: ContextVar[RequestTrace | None] = ContextVar("request_trace", default=None)


def current_trace() -> RequestTrace:
    """Return the trace of the request being served, or a detached one outside requests."""
    trace = _current.get()
    if trace is None:
        trace = RequestTrace(request_id=accept_request_id(None))
    return trace


def current_request_id() -> str | None:
    """Return the id of the request being served, or None outside requests."""
    trace = _current.get()
    return trace.request_id if trace is not None else None


def close_trace(trace: RequestTrace) -> None:
    """Stop ``trace`` being current: what runs next on this thread belongs to no request."""
    if _current.get() is trace:
        _current.set(None)


def open_trace(request_id: str) -> RequestTrace:
    """Start the trace of a new request and make it current."""
    trace = RequestTrace(request_id=request_id)
    _current.set(trace)
    return trace
