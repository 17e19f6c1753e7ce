"""A worker's registry of live holds: renewed while their request lives, until it settles."""

from __future__ import annotations

import gc

from app.generations.live import LiveHolds


class Request:
    """Stands for a running request's object."""


def test_live_holds_forget_requests_that_are_gone():
    holds = LiveHolds()
    running, abandoned = Request(), Request()
    holds.track("h-running", running)
    holds.track("h-abandoned", abandoned)
    holds.track("h-settled", running)
    holds.forget("h-settled")
    del abandoned
    gc.collect()
    assert holds.hold_ids() == ["h-running"]


def test_owners_come_with_their_holds():
    holds = LiveHolds()
    first, second = Request(), Request()
    holds.track("h-1", first)
    holds.track("h-2", second)

    assert holds.owners() == [("h-1", first), ("h-2", second)]
