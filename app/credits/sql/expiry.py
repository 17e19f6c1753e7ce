"""The statements of a hold's time: renewing it while its stream runs, releasing it when it dies.

A stream's holds are pushed forward (``EXTEND_HOLDS``) and keep what the stream
delivered (``RECORD_PROGRESS``); a hold past its expiry gives back what it reserved on
its key and member (``RELEASE_ON_KEY``, ``RELEASE_ON_MEMBER``).
"""

from __future__ import annotations

from sqlalchemy import bindparam, update

from app.credits.models import OPEN
from app.credits.sql.guards import KEY_ROW, KEYS_MEMBER, amount, holds, keys, memberships, noted
from app.database import UTCDateTime

# An expired hold gives back its reservations, from the rows it reserved on alone.
RELEASE_ON_KEY = (
    update(keys)
    .where(KEY_ROW, noted(holds.c.reserved_on_key))
    .values(window_reserved=keys.c.window_reserved - amount)
)
RELEASE_ON_MEMBER = (
    update(memberships)
    .where(KEYS_MEMBER, noted(holds.c.reserved_on_member))
    .values(window_reserved=memberships.c.window_reserved - amount)
)


EXTEND_HOLDS = (
    update(holds)
    .where(holds.c.id.in_(bindparam("hold_ids", expanding=True)), holds.c.status == OPEN)
    .values(expires_at=bindparam("expires_at", type_=UTCDateTime()))
)
RECORD_PROGRESS = (
    update(holds)
    .where(holds.c.id == bindparam("hold_id"), holds.c.status == OPEN)
    .values(progress=bindparam("progress"))
)
# The same, run alone (execute_alone): its RETURNING gives the driver rows to read.
RECORD_PROGRESS_ALONE = RECORD_PROGRESS.returning(holds.c.id)
