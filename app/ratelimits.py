"""Per-key rate limits: 429 in the envelope, with Retry-After, shared through Redis if set.

Requests are counted per bearer token (its digest, so the counter names no secret), or
per client address when there is none, before the key is even looked up: a flood of
made-up keys is limited like any other caller. With ``REDIS_URL`` every worker and
instance shares the counters; without it each worker process counts on its own.
"""

from __future__ import annotations

import hashlib

from flask import Flask, Response, current_app, request
from flask_limiter import Limiter
from flask_limiter.errors import RateLimitExceeded

from app.auth.decorators import bearer_token
from app.errors import APIError, error_response


class RateLimited(APIError):
    """The caller sent more requests than its limit allows (429)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


def caller_identity() -> str:
    """Return what requests are counted by: the bearer token's digest, else the address."""
    token = bearer_token(request.headers.get("Authorization"))
    if token:
        return "key:" + hashlib.sha256(token.encode()).hexdigest()[:32]
    return "addr:" + (request.remote_addr or "unknown")


def current_rate_limit() -> str:
    """Return the app's limit per caller, such as ``600 per minute``."""
    return current_app.config["RATE_LIMIT"]


limiter = Limiter(key_func=caller_identity, default_limits=[current_rate_limit])


def handle_rate_limited(error: RateLimitExceeded) -> Response:
    """Answer 429 in the envelope; the limiter adds Retry-After to the response."""
    return error_response(
        RateLimited(
            f"Rate limit reached: {error.description} per API key. "
            "Retry after the number of seconds in the Retry-After header."
        )
    )


def init_rate_limits(app: Flask) -> None:
    """Bind the limiter: Redis storage when REDIS_URL is set, memory otherwise."""
    app.config.setdefault("RATELIMIT_STORAGE_URI", app.config.get("REDIS_URL") or "memory://")
    app.config.setdefault("RATELIMIT_ENABLED", app.config["RATE_LIMIT"] != "off")
    app.config.setdefault("RATELIMIT_HEADERS_ENABLED", True)
    app.config.setdefault("RATELIMIT_KEY_PREFIX", "gateway")
    limiter.init_app(app)
    app.register_error_handler(RateLimitExceeded, handle_rate_limited)
