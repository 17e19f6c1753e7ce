"""Rate-limit counters: fixed windows in memory, and the fall back from an unreachable store."""

from __future__ import annotations

import logging

import pytest
from limits import parse
from limits.storage import MemoryStorage

from app import ratelimits
from app.observability import metrics
from app.ratelimits import Counters, WorkerWindows

THREE_A_MINUTE = parse("3 per minute")


class Clock:
    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr(ratelimits.time, "monotonic", lambda: self.now)


class FlakyStore(MemoryStorage):
    """A shared store whose answers stop while ``down`` is set."""

    down = False
    checks = 0

    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        if self.down:
            raise ConnectionError("the store does not answer")
        return super().incr(key, expiry, amount)

    def check(self) -> bool:
        self.checks += 1
        return not self.down


def test_a_window_counts_each_identity_apart_and_starts_over_when_it_ends(monkeypatch):
    clock = Clock(monkeypatch)
    windows = WorkerWindows()
    assert [windows.hit(THREE_A_MINUTE, "key:1") for _ in range(4)] == [True] * 3 + [False]
    assert windows.hit(THREE_A_MINUTE, "key:2")
    clock.now += 59
    assert not windows.hit(THREE_A_MINUTE, "key:1")
    clock.now += 1
    assert windows.hit(THREE_A_MINUTE, "key:1")


def test_ended_windows_are_dropped_once_a_sweep_is_due(monkeypatch):
    clock = Clock(monkeypatch)
    windows = WorkerWindows()
    windows.hit(THREE_A_MINUTE, "gone")
    windows.hit(parse("3 per hour"), "staying")
    clock.now += ratelimits.SWEEP_SECONDS
    windows.hit(THREE_A_MINUTE, "new")
    assert sorted(identifiers[0] for _, identifiers in windows._windows) == ["new", "staying"]


def fallbacks() -> float:
    return metrics.registry.get_sample_value("gateway_rate_limit_store_fallbacks_total") or 0.0


def test_an_unreachable_store_is_counted_around_in_memory_and_asked_again_with_backoff(
    monkeypatch, caplog
):
    clock = Clock(monkeypatch)
    store = FlakyStore()
    counters = Counters(store, "test")
    before = fallbacks()
    assert counters.hit(THREE_A_MINUTE, "key:1")
    store.down = True

    with caplog.at_level(logging.INFO, logger="app.ratelimits"):
        counted = [counters.hit(THREE_A_MINUTE, "key:1") for _ in range(3)]
        checks_at = [store.checks]
        for _ in range(70):
            clock.now += 1
            counters.hit(THREE_A_MINUTE, "key:2")
            checks_at.append(store.checks)
        store.down = False
        clock.now += 32
        counters.hit(THREE_A_MINUTE, "key:3")

    # Memory counted from zero: the store's count of key:1 is not there to add to.
    assert counted == [True, True, True]
    assert fallbacks() == before + 1
    asked_at = [second for second in range(1, 71) if checks_at[second] > checks_at[second - 1]]
    assert asked_at == [1, 3, 7, 15, 31, 63], "after waits of 1, 2, 4, 8, 16 and 32 seconds"
    messages = [record.getMessage() for record in caplog.records]
    assert sum("Rate limit storage unreachable" in message for message in messages) == 1
    assert "Rate limit storage recovered" in messages
    assert store.get(THREE_A_MINUTE.key_for("test", "key:3")) == 1


@pytest.mark.parametrize("store", [None, MemoryStorage()])
def test_only_a_shared_store_is_asked_whether_it_is_reachable(store):
    assert Counters(store, "test").store_reachable() is (None if store is None else True)
