"""The cooldown board: counting failures in a row, half-open probes, Redis failing open."""

from __future__ import annotations

import uuid

import pytest

from app.providers import cooldown
from app.providers.base import UpstreamConfig
from app.providers.cooldown import RedisCooldowns, UpstreamCooldowns, cooldown_policy


def upstream(**options) -> UpstreamConfig:
    return UpstreamConfig(
        name=f"up-{uuid.uuid4().hex[:8]}", kind="openai", options={"cooldown_after": 2, **options}
    )


@pytest.fixture(params=["local", "redis"])
def board(request):
    board = UpstreamCooldowns()
    board.configure(redis_url="redis://127.0.0.1:6379/0" if request.param == "redis" else None)
    return board


class Clock:
    def __init__(self, monkeypatch):
        self.now = 1000.0
        monkeypatch.setattr(cooldown.time, "monotonic", lambda: self.now)


def test_failures_in_a_row_start_a_cooldown_and_a_success_resets_them(board):
    config = upstream()
    board.note_failure(config)
    admission = board.admit(config)
    assert admission.allowed and admission.failures == 1
    board.note_success(config, after_failures=True)
    board.note_failure(config)
    assert board.admit(config).allowed

    board.note_failure(config)

    assert not board.admit(config).allowed
    assert board.state(config).seconds_left > 0


def test_after_the_cooldown_one_request_probes_alone(monkeypatch):
    clock = Clock(monkeypatch)
    board = UpstreamCooldowns()
    config = upstream(cooldown_seconds=10)
    board.note_failure(config)
    board.note_failure(config)
    assert not board.admit(config).allowed

    clock.now += 11
    probe = board.admit(config)
    others = board.admit(config)

    assert probe.allowed and not others.allowed
    board.note_success(config, after_failures=probe.failures > 0)
    assert board.admit(config).allowed and board.admit(config).allowed


def test_a_failed_probe_starts_the_cooldown_again(monkeypatch):
    clock = Clock(monkeypatch)
    board = UpstreamCooldowns()
    config = upstream(cooldown_seconds=10)
    board.note_failure(config)
    board.note_failure(config)
    clock.now += 11
    assert board.admit(config).allowed

    board.note_failure(config)

    assert not board.admit(config).allowed
    assert board.state(config).seconds_left == pytest.approx(10)


def test_an_unreachable_redis_falls_back_to_the_workers_own_count(caplog):
    board = UpstreamCooldowns()
    board.configure(redis_url="redis://127.0.0.1:1/0")
    config = upstream()

    assert board.admit(config).allowed
    board.note_failure(config)
    board.note_failure(config)

    assert not board.admit(config).allowed
    assert isinstance(board.store, RedisCooldowns)
    assert "Redis failed" in caplog.text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cooldown_after": 0}, "cooldown_after"),
        ({"cooldown_after": "3"}, "cooldown_after"),
        ({"cooldown_seconds": -1}, "cooldown_seconds"),
        ({"cooldown_seconds": True}, "cooldown_seconds"),
    ],
)
def test_bad_cooldown_settings_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        cooldown_policy(UpstreamConfig(name="u", kind="openai", options=options))
