"""Upstreams that are down are left alone for a while, then tried again by one request.

An upstream that failed ``cooldown_after`` calls in a row (catalog key, default 3) is
skipped for ``cooldown_seconds`` (default 30). After that one request may try it
(half-open); if that call fails the cooldown starts again, if it succeeds every request
uses it again. With ``REDIS_URL`` the count and the cooldown are shared by every worker
and instance; when Redis fails the worker falls back to its own count, so an outage of
Redis never stops requests.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import redis

from app.providers.base import UpstreamConfig

log = logging.getLogger(__name__)
DEFAULT_FAILURES = 3
DEFAULT_SECONDS = 30.0
REDIS_TIMEOUT_SECONDS = 0.25
# A failure count that is never reset (its upstream left the catalog) goes away after this.
FAILURES_TTL_SECONDS = 24 * 3600


@dataclass(frozen=True)
class CooldownPolicy:
    """When an upstream is cooled down, and for how long."""

    failures: int = DEFAULT_FAILURES
    seconds: float = DEFAULT_SECONDS


@dataclass(frozen=True)
class Admission:
    """Whether a request may call an upstream, and the failures in a row seen before it."""

    allowed: bool
    failures: int = 0


@dataclass(frozen=True)
class CooldownState:
    """An upstream's failures in a row, and the seconds its cooldown has left (0: none)."""

    failures: int
    seconds_left: float


def cooldown_policy(upstream: UpstreamConfig) -> CooldownPolicy:
    """Read ``cooldown_after`` and ``cooldown_seconds``; raise ValueError naming a bad one."""
    failures = upstream.options.get("cooldown_after", DEFAULT_FAILURES)
    seconds = upstream.options.get("cooldown_seconds", DEFAULT_SECONDS)
    if isinstance(failures, bool) or not isinstance(failures, int) or failures <= 0:
        raise ValueError("cooldown_after must be a positive integer")
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ValueError("cooldown_seconds must be a positive number of seconds")
    return CooldownPolicy(failures=failures, seconds=float(seconds))


class LocalCooldowns:
    """The state of one worker process."""

    def __init__(self) -> None:
        self.failures: dict[str, int] = {}
        self.cooling_until: dict[str, float] = {}
        self.probing_until: dict[str, float] = {}

    def admit(self, name: str, policy: CooldownPolicy) -> Admission:
        """Let a request call ``name`` unless it is cooling down or already being probed."""
        now = time.monotonic()
        failures = self.failures.get(name, 0)
        if self.cooling_until.get(name, 0.0) > now:
            return Admission(False, failures)
        if failures >= policy.failures:
            if self.probing_until.get(name, 0.0) > now:
                return Admission(False, failures)
            self.probing_until[name] = now + policy.seconds
        return Admission(True, failures)

    def note_success(self, name: str) -> None:
        """Reset ``name``'s failures in a row."""
        self.failures.pop(name, None)
        self.probing_until.pop(name, None)

    def note_failure(self, name: str, policy: CooldownPolicy) -> None:
        """Count a failure of ``name``; start its cooldown at the policy's count."""
        self.failures[name] = failures = self.failures.get(name, 0) + 1
        if failures >= policy.failures:
            self.cooling_until[name] = time.monotonic() + policy.seconds
            self.probing_until.pop(name, None)

    def state(self, name: str) -> CooldownState:
        """Return ``name``'s state now."""
        left = self.cooling_until.get(name, 0.0) - time.monotonic()
        return CooldownState(self.failures.get(name, 0), max(left, 0.0))


class RedisCooldowns:
    """State shared through Redis; each call falls back to the worker's own on a Redis error."""

    def __init__(self, client: redis.Redis, fallback: LocalCooldowns) -> None:
        self.client = client
        self.fallback = fallback
        self.failing = False

    @staticmethod
    def keys(name: str) -> tuple[str, str, str]:
        """Return the keys of ``name``'s failure count, cooldown and probe."""
        prefix = f"gateway:cooldown:{name}:"
        return prefix + "failures", prefix + "cooling", prefix + "probe"

    def _shared(self, operation: str, *args: Any) -> Any:
        try:
            result = getattr(self, "_" + operation)(*args)
        except redis.RedisError as exc:
            if not self.failing:
                log.warning("upstream cooldowns: Redis failed (%s); counting per worker", exc)
            self.failing = True
            return getattr(self.fallback, operation)(*args)
        self.failing = False
        return result

    def admit(self, name: str, policy: CooldownPolicy) -> Admission:
        """Let a request call ``name`` unless it is cooling down or already being probed."""
        return self._shared("admit", name, policy)

    def note_success(self, name: str) -> None:
        """Reset ``name``'s failures in a row."""
        self._shared("note_success", name)

    def note_failure(self, name: str, policy: CooldownPolicy) -> None:
        """Count a failure of ``name``; start its cooldown at the policy's count."""
        self._shared("note_failure", name, policy)

    def state(self, name: str) -> CooldownState:
        """Return ``name``'s state now."""
        return self._shared("state", name)

    def _admit(self, name: str, policy: CooldownPolicy) -> Admission:
        failures_key, cooling_key, probe_key = self.keys(name)
        raw_failures, cooling = self.client.mget(failures_key, cooling_key)
        failures = int(raw_failures or 0)
        if cooling is not None:
            return Admission(False, failures)
        if failures >= policy.failures:
            # Half-open: the first request to claim the probe tries the upstream alone.
            claimed = self.client.set(probe_key, 1, nx=True, px=_ms(policy.seconds))
            return Admission(bool(claimed), failures)
        return Admission(True, failures)

    def _note_success(self, name: str) -> None:
        failures_key, _, probe_key = self.keys(name)
        self.client.delete(failures_key, probe_key)

    def _note_failure(self, name: str, policy: CooldownPolicy) -> None:
        failures_key, cooling_key, probe_key = self.keys(name)
        with self.client.pipeline() as pipe:
            pipe.incr(failures_key).expire(failures_key, FAILURES_TTL_SECONDS)
            failures, _ = pipe.execute()
        if failures >= policy.failures:
            with self.client.pipeline() as pipe:
                pipe.set(cooling_key, 1, px=_ms(policy.seconds)).delete(probe_key).execute()

    def _state(self, name: str) -> CooldownState:
        failures_key, cooling_key, _ = self.keys(name)
        with self.client.pipeline() as pipe:
            failures, left_ms = pipe.get(failures_key).pttl(cooling_key).execute()
        return CooldownState(int(failures or 0), max(left_ms, 0) / 1000)


def _ms(seconds: float) -> int:
    return max(math.ceil(seconds * 1000), 1)


class UpstreamCooldowns:
    """The service's cooldown board: per worker, or shared once ``configure`` names Redis."""

    def __init__(self) -> None:
        self.store: LocalCooldowns | RedisCooldowns = LocalCooldowns()

    def configure(self, *, redis_url: str | None) -> None:
        """Share the state through ``redis_url``; None keeps it per worker."""
        local = LocalCooldowns()
        if not redis_url:
            self.store = local
            return
        client = redis.Redis.from_url(
            redis_url,
            socket_timeout=REDIS_TIMEOUT_SECONDS,
            socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
        )
        self.store = RedisCooldowns(client, local)

    def admit(self, upstream: UpstreamConfig) -> Admission:
        """Return whether a request may call ``upstream`` now."""
        return self.store.admit(upstream.name, cooldown_policy(upstream))

    def note_success(self, upstream: UpstreamConfig, *, after_failures: bool) -> None:
        """Record a call that worked; only a count that was running needs a reset."""
        if after_failures:
            self.store.note_success(upstream.name)

    def note_failure(self, upstream: UpstreamConfig) -> None:
        """Record a call that failed."""
        self.store.note_failure(upstream.name, cooldown_policy(upstream))

    def state(self, upstream: UpstreamConfig) -> CooldownState:
        """Return ``upstream``'s failures in a row and the cooldown it has left."""
        return self.store.state(upstream.name)


upstream_cooldowns = UpstreamCooldowns()
