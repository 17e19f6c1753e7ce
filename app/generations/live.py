"""The generations this worker process is running, by their hold: what its sweeper renews."""

from __future__ import annotations

import weakref


class LiveHolds:
    """The open holds of the requests this worker process is running.

    A hold is tracked with the object of the request that owns it, by weak reference: a
    request that ends without settling (its response was never read) stops its hold's
    renewal when it is garbage, and the hold then expires as a dead worker's would.
    """

    def __init__(self) -> None:
        self._owners: dict[str, weakref.ref] = {}

    def track(self, hold_id: str, owner: object) -> None:
        """Renew ``hold_id`` while ``owner`` lives, until ``forget``."""
        self._owners[hold_id] = weakref.ref(owner)

    def forget(self, hold_id: str) -> None:
        """Stop renewing ``hold_id`` (its request settled)."""
        self._owners.pop(hold_id, None)

    def owners(self) -> list[tuple[str, object]]:
        """Return each hold to renew with the request that owns it."""
        owners = []
        for hold_id, reference in list(self._owners.items()):
            owner = reference()
            if owner is None:
                self._owners.pop(hold_id, None)
            else:
                owners.append((hold_id, owner))
        return owners

    def hold_ids(self) -> list[str]:
        """Return the holds to renew, dropping those whose request is gone."""
        return [hold_id for hold_id, _ in self.owners()]


live_holds = LiveHolds()
