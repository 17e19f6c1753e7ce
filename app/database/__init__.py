"""The database: column types, and the three doors every write of the app goes through.

Domain code writes through ``write_transaction``, ``execute_alone`` and
``execute_durably`` and never asks which database runs them: SQLite's group commit,
PostgreSQL's kept connections and shared WAL flushes, and the driver-level execution
of prebuilt statements stay behind these doors.
"""

from app.database.connections import (
    AUTOCOMMIT_ENGINE,
    KEPT_CONNECTIONS,
    StatementsNotSent,
    again_after_deadlock,
    execute_alone,
    execute_durably,
    failure_reason,
    init_database,
    lock_until_commit,
    runs_alone,
    write_transaction,
)
from app.database.driver import PREPARED_STATEMENTS_LOST, execute_on_driver, fetch_on_driver
from app.database.expressions import later_of, sha256_hex, utc_hour, utc_iso_text
from app.database.notices import ChangeNotices, change_notices
from app.database.postgresql import COMMIT_AS_CHOSEN, COMMIT_WITHOUT_WAITING
from app.database.types import BoundStatement, Money, UTCDateTime, utcnow

__all__ = [
    "AUTOCOMMIT_ENGINE",
    "COMMIT_AS_CHOSEN",
    "COMMIT_WITHOUT_WAITING",
    "KEPT_CONNECTIONS",
    "PREPARED_STATEMENTS_LOST",
    "BoundStatement",
    "ChangeNotices",
    "Money",
    "StatementsNotSent",
    "again_after_deadlock",
    "UTCDateTime",
    "change_notices",
    "execute_alone",
    "execute_durably",
    "execute_on_driver",
    "failure_reason",
    "fetch_on_driver",
    "init_database",
    "later_of",
    "lock_until_commit",
    "runs_alone",
    "sha256_hex",
    "utc_hour",
    "utc_iso_text",
    "utcnow",
    "write_transaction",
]
