"""Rate limits: 429 in the envelope with Retry-After, shared through Redis when it is set.

A request with a known key is counted against that key (by its id); every other request
(no key, a malformed or unknown one) against its client address, so made-up keys share
one counter instead of each getting a fresh one. The key is looked up once per request,
for the limiter and the view alike, and the count costs one Redis round trip.

With ``REDIS_URL`` every worker and instance shares the counters. When Redis does not
answer (short socket timeouts), each worker counts in its own memory instead, logs one
warning for the outage and tries Redis again after a few seconds, backing off; without
``REDIS_URL`` each worker always counts on its own.
"""

from __future__ import annotations

import logging

from flask import Flask, Response, current_app, request
from flask_limiter import Limiter
from flask_limiter.errors import RateLimitExceeded

from app.auth.decorators import request_caller
from app.errors import APIError, error_response
from app.observability import metrics


class RateLimited(APIError):
    """The caller sent more requests than its limit allows (429)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


def caller_identity() -> str:
    """Return what a request is counted by: its key's id if the key exists, else its address."""
    caller = request_caller()
    if caller is not None:
        return f"key:{caller.key_id}"
    return "addr:" + (request.remote_addr or "unknown")


def current_rate_limit() -> str:
    """Return the app's limit per caller, such as ``600 per minute``."""
    return current_app.config["RATE_LIMIT"]


limiter = Limiter(key_func=caller_identity, default_limits=[current_rate_limit])


def handle_rate_limited(error: RateLimitExceeded) -> Response:
    """Answer 429 in the envelope, with Retry-After.

    Retry-After is the limit's whole window: a fixed window's count starts over at most
    that long after it started, and asking the store for the exact moment would cost a
    second round trip on every refused request.
    """
    window_seconds = error.limit.limit.get_expiry()
    return error_response(
        RateLimited(
            f"Rate limit reached: {error.description} per API key. "
            "Retry after the number of seconds in the Retry-After header."
        ),
        headers={"Retry-After": str(window_seconds)},
    )


def rate_limit_store_reachable() -> bool | None:
    """Tell whether the shared store (Redis) answers; None when there is none (memory)."""
    if not current_app.config.get("REDIS_URL") or not limiter.enabled:
        return None
    return bool(limiter.storage.check())


class FallbackCounter(logging.Handler):
    """Count the limiter's falls back to per-worker memory, which Flask-Limiter only logs."""

    def emit(self, record: logging.LogRecord) -> None:
        """Count a "storage unreachable" warning of the limiter."""
        if "falling back" in record.getMessage():
            metrics.rate_limit_fallbacks.inc()


def init_rate_limits(app: Flask) -> None:
    """Bind the limiter: Redis storage when REDIS_URL is set, with memory to fall back on."""
    timeout = app.config["REDIS_TIMEOUT_SECONDS"]
    app.config.setdefault("RATELIMIT_STORAGE_URI", app.config.get("REDIS_URL") or "memory://")
    app.config.setdefault(
        "RATELIMIT_STORAGE_OPTIONS",
        {"socket_connect_timeout": timeout, "socket_timeout": timeout},
    )
    app.config.setdefault("RATELIMIT_IN_MEMORY_FALLBACK_ENABLED", True)
    app.config.setdefault("RATELIMIT_ENABLED", app.config["RATE_LIMIT"] != "off")
    # Window statistics for X-RateLimit-* headers would cost more round trips on every
    # answer; Retry-After goes on 429s alone, from handle_rate_limited.
    app.config.setdefault("RATELIMIT_HEADERS_ENABLED", False)
    app.config.setdefault("RATELIMIT_KEY_PREFIX", "gateway")
    limiter.init_app(app)
    if not any(isinstance(h, FallbackCounter) for h in limiter.logger.handlers):
        limiter.logger.addHandler(FallbackCounter())
    app.register_error_handler(RateLimitExceeded, handle_rate_limited)
