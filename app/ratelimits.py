"""Rate limits: 429 in the envelope with Retry-After, shared through Redis when it is set.

A request with a known key is counted against that key (by its id); every other request
(no key, a malformed or unknown one) against its client address, so made-up keys share
one counter instead of each getting a fresh one. The key is looked up once per request,
for the limiter and the view alike, and the count costs one Redis round trip.

With ``REDIS_URL`` every worker and instance shares the counters. When Redis does not
answer (short socket timeouts), each worker counts in its own memory instead, logs one
warning for the outage and tries Redis again after a few seconds, backing off; without
``REDIS_URL`` each worker always counts on its own.

Every view is counted against ``RATE_LIMIT`` (fixed windows, one counter per caller and
view), except those of exempt blueprints (``limiter.exempt``) and static files; a view
with limits of its own (``limiter.limit``: the dashboard's sign-in) is counted against
those instead, for the methods they name. A request costs one ``before_request`` and one
``hit`` on a counter (the ``limits`` library's fixed window on Redis, a dict in memory).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from flask import Blueprint, Flask, Response, current_app, request
from limits import RateLimitItem, parse_many
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter
from werkzeug.exceptions import TooManyRequests

from app.auth.decorators import request_caller
from app.errors import APIError, error_response
from app.observability import metrics

log = logging.getLogger(__name__)

View = TypeVar("View", bound=Callable[..., Any])
# Seconds before the first attempt to reach Redis again after it stopped answering; each
# failed attempt doubles the wait, up to the longest.
FIRST_RETRY_SECONDS = 1.0
LONGEST_RETRY_SECONDS = 32.0
# How often a worker drops the counts of windows that have ended.
SWEEP_SECONDS = 60.0


class RateLimited(APIError):
    """The caller sent more requests than its limit allows (429)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class RateLimitExceeded(TooManyRequests):
    """A request went over ``limit``; the API and the dashboard each answer it their way."""

    def __init__(self, limit: RateLimitItem) -> None:
        super().__init__(str(limit))
        self.limit = limit


def caller_identity() -> str:
    """Return what a request is counted by: its key's id if the key exists, else its address."""
    caller = request_caller()
    if caller is not None:
        return f"key:{caller.key_id}"
    return "addr:" + (request.remote_addr or "unknown")


def own_limits(
    counted_by: Iterable[tuple[Callable[[], str], Callable[[], str]]],
) -> list[tuple[RateLimitItem, str]]:
    """Return each limit of ``counted_by`` with what the request is counted by for it."""
    counted = []
    for limit_of, identity_of in counted_by:
        identity = identity_of()
        counted += [(limit, identity) for limit in parse_many(limit_of())]
    return counted


class WorkerWindows:
    """Fixed windows counted in this worker's memory.

    Not the limits library's MemoryStorage: it expires counts from a timer thread that it
    checks, and restarts, on every count, which under gevent is a switch to the hub on
    every request. Here a count expires when it is next counted, and once a minute the
    windows that ended are dropped, so that callers who left do not pile up.
    """

    def __init__(self) -> None:
        self._windows: dict[tuple[RateLimitItem, tuple[str, ...]], tuple[float, int]] = {}
        self._next_sweep = time.monotonic() + SWEEP_SECONDS

    def hit(self, limit: RateLimitItem, *identifiers: str) -> bool:
        """Count one request against ``limit`` for ``identifiers``; False when it is over."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        # Not the shared store's string key (limit.key_for): building it cost more than
        # the count itself, and nothing outside this worker reads these windows.
        key = (limit, identifiers)
        ends, count = self._windows.get(key, (0.0, 0))
        if ends <= now:
            ends, count = now + limit.get_expiry(), 0
        count += 1
        self._windows[key] = (ends, count)
        return count <= limit.amount

    def _sweep(self, now: float) -> None:
        self._windows = {key: window for key, window in self._windows.items() if window[0] > now}
        self._next_sweep = now + SWEEP_SECONDS


class Counters:
    """Counts in the shared store (Redis); in this worker's memory without one, or while down."""

    def __init__(self, store: Storage | None, key_prefix: str) -> None:
        self.store = store
        self._shared = FixedWindowRateLimiter(store) if store is not None else None
        self._memory = WorkerWindows()
        self._key_prefix = key_prefix
        self._store_down = False
        self._retry_wait = FIRST_RETRY_SECONDS
        self._next_retry = 0.0

    def hit(self, limit: RateLimitItem, *identifiers: str) -> bool:
        """Count one request against ``limit`` for ``identifiers``; False when it is over."""
        if self._shared is None or (self._store_down and not self._store_is_back()):
            return self._memory.hit(limit, self._key_prefix, *identifiers)
        try:
            return self._shared.hit(limit, self._key_prefix, *identifiers)
        except Exception:  # whatever the store's client raises: requests go on regardless
            self._fall_back()
            return self._memory.hit(limit, self._key_prefix, *identifiers)

    def store_reachable(self) -> bool | None:
        """Tell whether the shared store answers now; None when there is none."""
        if self.store is None:
            return None
        return bool(self.store.check())

    def _fall_back(self) -> None:
        # Concurrent requests may all fail on the same outage: only the first one tells.
        if self._store_down:
            return
        log.warning("Rate limit storage unreachable - falling back to in-memory storage")
        metrics.rate_limit_fallbacks.inc()
        self._store_down = True
        self._retry_wait = FIRST_RETRY_SECONDS
        self._next_retry = time.monotonic() + self._retry_wait

    def _store_is_back(self) -> bool:
        now = time.monotonic()
        if now < self._next_retry:
            return False
        # Set before asking, so that requests meanwhile keep to memory instead of asking too.
        self._retry_wait = min(self._retry_wait * 2, LONGEST_RETRY_SECONDS)
        self._next_retry = now + self._retry_wait
        if not self.store_reachable():
            return False
        log.info("Rate limit storage recovered")
        self._store_down = False
        return True


class RateLimits:
    """One app's limits: RATE_LIMIT for every counted request, and where they are counted."""

    def __init__(self, counters: Counters, default_limits: list[RateLimitItem]) -> None:
        self.counters = counters
        self.default_limits = default_limits

    def enforce(self, counted: Iterable[tuple[RateLimitItem, str]], view: str) -> None:
        """Count the request against each (limit, identity), shortest window first.

        Counting stops at the first limit the request is over: the longer windows do not
        count a refused request.

        :raise RateLimitExceeded: the request is over one of the limits.
        """
        for limit, identity in sorted(counted, key=lambda pair: pair[0]):
            if not self.counters.hit(limit, identity, view):
                log.info("ratelimit %s (%s) exceeded at endpoint: %s", limit, identity, view)
                raise RateLimitExceeded(limit)


def rate_limits_of(app: Flask) -> RateLimits | None:
    """Return the app's limits, or None when RATE_LIMIT is off."""
    return app.extensions.get("rate_limits")


class Limiter:
    """Counts requests per caller against RATE_LIMIT, and views against limits of their own."""

    def __init__(self) -> None:
        self._exempt_blueprints: set[str] = set()

    def init_app(self, app: Flask) -> None:
        """Count every request of ``app`` from now on, unless RATE_LIMIT is off."""
        if not app.config["RATELIMIT_ENABLED"]:
            app.extensions["rate_limits"] = None
            return
        uri = app.config["RATELIMIT_STORAGE_URI"]
        store = None
        if not uri.startswith("memory://"):
            store = storage_from_string(uri, **app.config["RATELIMIT_STORAGE_OPTIONS"])
        counters = Counters(store, app.config["RATELIMIT_KEY_PREFIX"])
        app.extensions["rate_limits"] = RateLimits(counters, parse_many(app.config["RATE_LIMIT"]))
        app.before_request(self.count_request)

    def exempt(self, blueprint: Blueprint) -> Blueprint:
        """Leave the views of ``blueprint`` uncounted (probes, metrics, documents)."""
        self._exempt_blueprints.add(blueprint.name)
        return blueprint

    def count_request(self) -> None:
        """Count the request against RATE_LIMIT, unless it is exempt or its view counts it.

        :raise RateLimitExceeded: the caller is over RATE_LIMIT for this view.
        """
        # The request and the app are read once each: every use of one of Flask's
        # proxies looks the request's context up again, which costs more than a count.
        served, app = request._get_current_object(), current_app._get_current_object()
        view = served.endpoint
        if view is None:  # no route: a 404 or 405 that no view serves
            return
        blueprint, _, name = view.rpartition(".")
        if name == "static" or blueprint in self._exempt_blueprints:
            return
        view_function = app.view_functions[view]
        if served.method in getattr(view_function, "rate_limited_methods", ()):
            return
        limits = app.extensions["rate_limits"]
        identity = caller_identity()
        limits.enforce([(limit, identity) for limit in limits.default_limits], view)

    def limit(
        self, *counted_by: tuple[Callable[[], str], Callable[[], str]], methods: Iterable[str]
    ) -> Callable[[View], View]:
        """Count a view's ``methods`` against limits of its own instead of RATE_LIMIT.

        Each of ``counted_by`` pairs a function returning limits (such as ``5 per
        minute;20 per hour``) with one returning what the request is counted by. Both
        are called when the view runs, after the blueprint's own checks (CSRF); the
        view's other methods are counted against RATE_LIMIT.
        """
        limited_methods = frozenset(method.upper() for method in methods)

        def decorate(view: View) -> View:
            @functools.wraps(view)
            def limited_view(*args: Any, **kwargs: Any) -> Any:
                limits = rate_limits_of(current_app)
                if limits is not None and request.method in limited_methods:
                    limits.enforce(own_limits(counted_by), request.endpoint)
                return view(*args, **kwargs)

            limited_view.rate_limited_methods = limited_methods  # type: ignore[attr-defined]
            return limited_view  # type: ignore[return-value]

        return decorate


limiter = Limiter()


def handle_rate_limited(error: RateLimitExceeded) -> Response:
    """Answer 429 in the envelope, with Retry-After.

    Retry-After is the limit's whole window: a fixed window's count starts over at most
    that long after it started, and asking the store for the exact moment would cost a
    second round trip on every refused request.
    """
    window_seconds = error.limit.get_expiry()
    return error_response(
        RateLimited(
            f"Rate limit reached: {error.description} per API key. "
            "Retry after the number of seconds in the Retry-After header."
        ),
        headers={"Retry-After": str(window_seconds)},
    )


def rate_limit_store_reachable() -> bool | None:
    """Tell whether the shared store (Redis) answers; None when there is none (memory)."""
    limits = rate_limits_of(current_app)
    return None if limits is None else limits.counters.store_reachable()


def init_rate_limits(app: Flask) -> None:
    """Bind the limiter: Redis storage when REDIS_URL is set, with memory to fall back on."""
    timeout = app.config["REDIS_TIMEOUT_SECONDS"]
    app.config.setdefault("RATELIMIT_STORAGE_URI", app.config.get("REDIS_URL") or "memory://")
    app.config.setdefault(
        "RATELIMIT_STORAGE_OPTIONS",
        {"socket_connect_timeout": timeout, "socket_timeout": timeout},
    )
    app.config.setdefault("RATELIMIT_ENABLED", app.config["RATE_LIMIT"] != "off")
    app.config.setdefault("RATELIMIT_KEY_PREFIX", "gateway")
    limiter.init_app(app)
    app.register_error_handler(RateLimitExceeded, handle_rate_limited)
