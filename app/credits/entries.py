"""The ledger's one write of money: an entry chained after its account's head, with its balance.

Every change to a balance (a grant, a take-back, a charge) goes through append_entry:
the entry carries the digest of its fields and of the account's head (app.credits.chain),
and the UPDATE that changes the balance, and gives back what was reserved, moves the
head to it, in the caller's transaction (app.credits.sql.entries).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sqlalchemy.engine import Connection

from app.credits.chain import epoch_micros
from app.credits.sql import entries as entry_sql
from app.database import execute_on_driver, utcnow


def append_entry(
    connection: Connection,
    *,
    account_id: int,
    kind: str,
    amount: Decimal,
    generation_id: str | None = None,
    reference: str | None = None,
    note: str | None = None,
    released: Decimal = Decimal(0),
    guard: Any = None,
) -> bool:
    """Add ``amount`` to the balance with its entry, chained; return False if ``guard`` refused.

    ``released`` is given back of the account's reservation in the same UPDATE. On
    PostgreSQL one statement; on SQLite the entry, then the UPDATE that moves the
    balance and the head to it (entry_sql.insert_chained_entry).
    """
    now = utcnow()
    parameters = {
        "account_id": account_id,
        "charge": -amount,
        "released": released,
        "entry_kind": kind,
        "entry_generation": generation_id,
        "entry_reference": reference,
        "entry_note": note[:255] if note else note,
        "entry_at": now,
        "entry_micros": epoch_micros(now),
    }
    if connection.dialect.name == "postgresql":
        return execute_on_driver(connection, entry_sql.chained_debit_alone(guard), parameters) == 1
    if execute_on_driver(connection, entry_sql.insert_chained_entry(guard), parameters) != 1:
        return False
    execute_on_driver(connection, entry_sql.DEBIT_TO_NEW_HEAD, parameters)
    return True
