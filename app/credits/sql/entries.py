"""The statements that write a ledger entry, chained after its account's head.

An entry is written with the digest of its fields and of the account's head
(app.credits.chain), and the UPDATE that changes the balance moves the head to it:
on SQLite an INSERT then that UPDATE (``insert_chained_entry``, ``DEBIT_TO_NEW_HEAD``),
on PostgreSQL one statement whose steps lock the account's row before the entry's id
is drawn (``ChainedDebit``, ``chained_debit_alone``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Insert,
    String,
    bindparam,
    func,
    insert,
    literal_column,
    select,
    update,
)

from app.credits.chain import sql_digest
from app.credits.sql.guards import (
    ACCOUNT_ROW,
    DEBIT_AND_RELEASE,
    ZERO,
    accounts,
    charge,
    constant,
    entries,
)
from app.database import UTCDateTime
from app.money import MAX_MONEY, money_units


# The ledger's chain (app.credits.chain): an entry is written with the digest of its
# fields and of the account's head, and the UPDATE that changes the balance moves the
# head to it. What the entry is: a charge is ``charge`` (its amount is -charge), a grant
# a negative charge; ``released`` is what the change gives back of the reservation.
@dataclass(frozen=True)
class EntryValues:
    """The expressions an entry's kind, generation, reference, note and time are written from."""

    kind: Any
    generation_id: Any
    reference: Any
    note: Any
    at: Any
    micros: Any


# A step's entry: every value a parameter.
STEP_ENTRY = EntryValues(
    kind=bindparam("entry_kind", type_=String()),
    generation_id=bindparam("entry_generation", type_=String()),
    reference=bindparam("entry_reference", type_=String()),
    note=bindparam("entry_note", type_=String()),
    at=bindparam("entry_at", type_=UTCDateTime()),
    micros=bindparam("entry_micros", type_=BigInteger()),
)
# A grant's guard: the balance stays within what the ledger holds. On SQLite an integer
# sum past 64 bits turns to a float: it is refused before it is written.
WITHIN_MAX_BALANCE = accounts.c.balance <= constant(money_units(MAX_MONEY)) + charge
_CHAINED_COLUMNS = [
    "id",
    "account_id",
    "kind",
    "amount",
    "balance_after",
    "generation_id",
    "idempotency_key",
    "description",
    "created_at",
    "previous_hash",
    "entry_hash",
]
# SQLite's next id of an entry, under its write lock: what it would choose itself.
_NEXT_ENTRY_ID = select(func.coalesce(func.max(entries.c.id), ZERO) + constant(1)).scalar_subquery()


def _digest(entry_id: Any, account: Any, balance: Any, head: Any, values: EntryValues) -> Any:
    """Return the digest of the entry ``values`` describe, written after ``head``."""
    return sql_digest(
        entry_id,
        account,
        values.kind,
        -charge,
        balance - charge,
        values.generation_id,
        values.reference,
        values.micros,
        head,
    )


@functools.lru_cache(maxsize=4)
def insert_chained_entry(guard: ColumnElement[bool] | None = None) -> Insert:
    """Return SQLite's INSERT of a step's entry, chained after the account's head.

    Written from the account's row (none if ``guard`` fails it), before the balance
    changes: DEBIT_TO_NEW_HEAD then moves the balance and the head to it.
    """
    row = select(
        _NEXT_ENTRY_ID,
        accounts.c.id,
        STEP_ENTRY.kind,
        -charge,
        accounts.c.balance - charge,
        STEP_ENTRY.generation_id,
        STEP_ENTRY.reference,
        STEP_ENTRY.note,
        STEP_ENTRY.at,
        accounts.c.ledger_head,
        _digest(
            _NEXT_ENTRY_ID, accounts.c.id, accounts.c.balance, accounts.c.ledger_head, STEP_ENTRY
        ),
    ).where(ACCOUNT_ROW, *([guard] if guard is not None else []))
    return insert(entries).from_select(_CHAINED_COLUMNS, row)


DEBIT_TO_NEW_HEAD = (
    update(accounts)
    .where(ACCOUNT_ROW)
    .values(
        {
            **DEBIT_AND_RELEASE,
            accounts.c.ledger_head: select(entries.c.entry_hash)
            .where(entries.c.id == func.last_insert_rowid())
            .scalar_subquery(),
        }
    )
)


@dataclass(frozen=True)
class ChainedDebit:
    """PostgreSQL's debit with its entry, as steps of one statement.

    The account's row is locked first, and the entry's id drawn only then: an account's
    entries are chained in the order of their ids however many write at once.
    """

    steps: tuple[CTE, ...]
    entry: Insert

    @classmethod
    def of(cls, account_row: Any, guard: Any, values: EntryValues) -> ChainedDebit:
        """Chain an entry of ``values`` to the account of ``account_row``, if ``guard`` passes."""
        locked = (
            select(accounts.c.id, accounts.c.ledger_head)
            .where(account_row, *([guard] if guard is not None else []))
            .with_for_update(key_share=True)
        ).cte("chain_locked")
        numbered = select(
            locked.c.id,
            locked.c.ledger_head,
            func.nextval(literal_column("'ledger_entries_id_seq'")).label("entry_id"),
        ).cte("chain_numbered")
        digest = _digest(
            numbered.c.entry_id, accounts.c.id, accounts.c.balance, numbered.c.ledger_head, values
        )
        debited = (
            update(accounts)
            .where(accounts.c.id == numbered.c.id)
            .values({**DEBIT_AND_RELEASE, accounts.c.ledger_head: digest})
            .returning(
                accounts.c.id,
                accounts.c.balance,
                accounts.c.ledger_head,
                numbered.c.entry_id,
                numbered.c.ledger_head.label("previous_hash"),
            )
            .cte("debited")
        )
        row = select(
            debited.c.entry_id,
            debited.c.id,
            values.kind,
            -charge,
            debited.c.balance,
            values.generation_id,
            values.reference,
            values.note,
            values.at,
            debited.c.previous_hash,
            debited.c.ledger_head,
        )
        return cls((locked, numbered, debited), insert(entries).from_select(_CHAINED_COLUMNS, row))


@functools.lru_cache(maxsize=4)
def chained_debit_alone(guard: ColumnElement[bool] | None = None) -> Insert:
    """Return PostgreSQL's debit of a step with its chained entry, one statement (ChainedDebit)."""
    chained = ChainedDebit.of(ACCOUNT_ROW, guard, STEP_ENTRY)
    return chained.entry.add_cte(*chained.steps)
