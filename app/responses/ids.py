"""How responses and their items are named.

An item's id carries the id of the response it belongs to, so that a reference to it
(``item_reference``) finds its response without an index of every item.
"""

from __future__ import annotations

import secrets

RESPONSE_PREFIX = "resp_"
STEM_LENGTH = 40


def new_response_id() -> str:
    """Return a fresh response id, which is also its generation's id."""
    return RESPONSE_PREFIX + secrets.token_hex(STEM_LENGTH // 2)


class ItemIds:
    """Names the items of one response: ``<prefix>_<its response's stem><count>``."""

    def __init__(self, response_id: str) -> None:
        self.stem = response_id.removeprefix(RESPONSE_PREFIX)
        self.count = 0

    def next(self, prefix: str) -> str:
        """Return the next item id, with ``prefix`` (msg, fc, fco, rs)."""
        self.count += 1
        return f"{prefix}_{self.stem}{self.count:04x}"


def response_id_of_item(item_id: str) -> str | None:
    """Return the id of the response an item id names, or None for an id not made here."""
    _, _, rest = item_id.partition("_")
    stem = rest[:STEM_LENGTH]
    if len(rest) <= STEM_LENGTH or not all(c in "0123456789abcdef" for c in stem):
        return None
    return RESPONSE_PREFIX + stem
