"""The ledger's chains recomputed: where each account's first breaks, and how.

Each entry, in the order of its id, must have the digest of its own fields and of the
entry before it (app.credits.chain), and leave the balance the one before left plus
its amount; the account's row must keep the last entry's digest and balance. An entry
whose fields were changed, or that was removed, moved or written past the chain, and a
balance changed without an entry, are each found at the first entry they broke.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from app.credits.chain import GENESIS, ChainedFields
from app.credits.models import Account, LedgerEntry
from app.extensions import db


@dataclass(frozen=True)
class ChainProblem:
    """Where an account's chain breaks first, and how."""

    account_id: int
    entry_id: int | None
    problem: str

    def __str__(self) -> str:
        where = f"entry {self.entry_id}" if self.entry_id is not None else "its row"
        return f"account {self.account_id}, {where}: {self.problem}"


# How many entries are read at a time.
VERIFY_PAGE = 5_000


@dataclass(frozen=True)
class ChainReport:
    """What a verification checked, and where each broken chain breaks first."""

    accounts: int
    problems: list[ChainProblem]


def verify_chains(account_ids: list[int] | None = None) -> ChainReport:
    """Recompute the chain of every account (of ``account_ids``); report where each breaks."""
    query = select(Account.id, Account.balance, Account.ledger_head).order_by(Account.id)
    if account_ids:
        query = query.where(Account.id.in_(account_ids))
    accounts = db.session.execute(query).all()
    db.session.commit()
    problems = []
    for account_id, balance, head in accounts:
        problem = _first_break(account_id, balance, head)
        if problem is not None:
            problems.append(problem)
    return ChainReport(len(accounts), problems)


def _entries(account_id: int) -> Iterator[Any]:
    """Yield the account's entries in the order of their ids, a page at a time."""
    after = 0
    while True:
        page = db.session.execute(
            select(LedgerEntry)
            .where(LedgerEntry.account_id == account_id, LedgerEntry.id > after)
            .order_by(LedgerEntry.id)
            .limit(VERIFY_PAGE)
        ).scalars().all()
        db.session.expunge_all()
        db.session.commit()
        yield from page
        if len(page) < VERIFY_PAGE:
            return
        after = page[-1].id


def fields_of(entry: Any) -> ChainedFields:
    """Return what ``entry``'s (a LedgerEntry's) digest covers, as stored."""
    return ChainedFields(
        entry_id=entry.id,
        account_id=entry.account_id,
        kind=entry.kind,
        amount=entry.amount,
        balance_after=entry.balance_after if entry.balance_after is not None else Decimal(0),
        generation_id=entry.generation_id,
        reference=entry.idempotency_key,
        created_at=entry.created_at,
        previous_hash=entry.previous_hash or "",
    )


def _first_break(account_id: int, balance: Decimal, head: str) -> ChainProblem | None:
    """Return where the account's chain first breaks; None if it holds."""
    previous, running, last_id = GENESIS, Decimal(0), None
    for entry in _entries(account_id):
        problem = _entry_problem(entry, previous, running)
        if problem is not None:
            return ChainProblem(account_id, entry.id, problem)
        previous, running, last_id = entry.entry_hash, entry.balance_after, entry.id
    if head != previous:
        after = f"after entry {last_id}" if last_id is not None else "at the start"
        missing = f"its head is not its last entry's digest: entries {after} are missing"
        return ChainProblem(account_id, None, missing)
    if balance != running:
        return ChainProblem(
            account_id,
            None,
            f"its balance is {balance:f} but its entries leave {running:f}: "
            "the balance was changed without an entry",
        )
    return None


def _entry_problem(entry: Any, previous: str, running: Decimal) -> str | None:
    """Return what is wrong with ``entry`` after the chain so far (digest ``previous``)."""
    if entry.entry_hash is None:
        return "it is not chained"
    if fields_of(entry).digest() != entry.entry_hash:
        return "it differs from what was chained: its fields were changed"
    if entry.previous_hash != previous:
        return _misplaced(entry)
    if entry.balance_after != running + entry.amount:
        return (
            f"it leaves {entry.balance_after:f} after {running:f} and {entry.amount:f}: "
            "it was chained from a wrong balance"
        )
    return None


def _misplaced(entry: Any) -> str:
    """Say whether the entry it was chained after comes later (out of order) or is gone."""
    before = db.session.scalar(
        select(LedgerEntry.id).where(
            LedgerEntry.account_id == entry.account_id,
            LedgerEntry.entry_hash == entry.previous_hash,
        )
    )
    db.session.commit()
    if before is not None:
        return f"it is out of order: it was chained after entry {before}, which comes after it"
    return "the entry it was chained after is missing"
