"""Fixtures of the adapter tests: a replay server of recorded upstream transcripts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.providers.cooldown import upstream_cooldowns
from tests.upstream_server import ReplayServer


@pytest.fixture(autouse=True)
def fresh_cooldowns() -> None:
    """Every test starts with no upstream cooling down (the state is per process)."""
    upstream_cooldowns.configure(redis_url=None)


@pytest.fixture
def replay_server() -> Iterator[ReplayServer]:
    """A fresh replay server on a free 127.0.0.1 port, closed after the test."""
    server = ReplayServer()
    yield server
    server.close()
