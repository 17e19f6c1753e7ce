"""The ledger's chains recomputed: where each account's first breaks, and how.

Each entry, in the order of its id, must have the digest of its own fields and of the
entry before it (app.credits.chain), and leave the balance the one before left plus
its amount; the account's row must keep the last entry's digest and balance. An entry
whose fields were changed, or that was removed, moved or written past the chain, and a
balance changed without an entry, are each found at the first entry they broke.
"""

from __future__ import annotations

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

    @property
    def where(self) -> str:
        """Name the account, and the entry or its row."""
        at = f"entry {self.entry_id}" if self.entry_id is not None else "its row"
        return f"account {self.account_id}, {at}"

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


# How many entries are read at a time.
VERIFY_PAGE = 5_000


@dataclass(frozen=True)
class ChainReport:
    """What a verification checked, and where each broken chain breaks first."""

    accounts: int
    problems: list[ChainProblem]


def verify_chains(
    account_ids: list[int] | None = None, *, after: dict[int, int] | None = None
) -> ChainReport:
    """Recompute the chain of every account (of ``account_ids``); report where each breaks.

    ``after`` maps an account to an entry checked before (an audit's checkpoint): its
    chain is taken up after it, the entry's digest and balance trusted.
    """
    query = select(Account.id).order_by(Account.id)
    if account_ids is not None:
        query = query.where(Account.id.in_(account_ids))
    accounts = db.session.scalars(query).all()
    db.session.commit()
    problems = []
    for account_id in accounts:
        problem = _first_break(account_id, (after or {}).get(account_id))
        if problem is not None:
            problems.append(problem)
    return ChainReport(len(accounts), problems)


def fields_of(entry: Any) -> ChainedFields:
    """Return what ``entry``'s (a LedgerEntry or a row of its columns) digest covers, as stored."""
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


# What an entry's check reads of it (and a statement shows of it): its rows, not objects
# the session would keep.
CHAINED_COLUMNS = (
    LedgerEntry.id,
    LedgerEntry.account_id,
    LedgerEntry.kind,
    LedgerEntry.amount,
    LedgerEntry.balance_after,
    LedgerEntry.generation_id,
    LedgerEntry.idempotency_key,
    LedgerEntry.created_at,
    LedgerEntry.previous_hash,
    LedgerEntry.entry_hash,
)


class _BrokenAt(Exception):
    """The chain broke at an entry (None: at the account's row), as the message says."""

    def __init__(self, entry_id: int | None, problem: str) -> None:
        super().__init__(problem)
        self.entry_id, self.problem = entry_id, problem


class _Walk:
    """An account's chain followed entry by entry: the last digest, balance and id."""

    def __init__(self, account_id: int, after: int | None) -> None:
        self.account_id = account_id
        self.previous, self.running, self.last_id = GENESIS, Decimal(0), after
        if after is not None:
            start = db.session.execute(
                select(LedgerEntry.entry_hash, LedgerEntry.balance_after).where(
                    LedgerEntry.id == after
                )
            ).first()
            db.session.commit()
            if start is None:
                raise _BrokenAt(after, "the entry the last audit ended at is missing")
            self.previous, self.running = start

    def walk_on(self) -> dict[str, Decimal]:
        """Check the entries after the last one walked; return each one's digest and balance.

        :raise _BrokenAt: at the first that breaks the chain.
        """
        walked = {}
        while True:
            page = db.session.execute(
                select(*CHAINED_COLUMNS)
                .where(
                    LedgerEntry.account_id == self.account_id,
                    LedgerEntry.id > (self.last_id or 0),
                )
                .order_by(LedgerEntry.id)
                .limit(VERIFY_PAGE)
            ).all()
            db.session.commit()
            for entry in page:
                problem = _entry_problem(entry, self.previous, self.running)
                if problem is not None:
                    raise _BrokenAt(entry.id, problem)
                self.previous, self.running = entry.entry_hash, entry.balance_after
                self.last_id = entry.id
                walked[entry.entry_hash] = entry.balance_after
            if len(page) < VERIFY_PAGE:
                return walked


def _first_break(account_id: int, after: int | None) -> ChainProblem | None:
    """Return where the account's chain first breaks; None if it holds.

    The account's row is read after its entries, and the entries written meanwhile
    after it: a chain that grows while it is verified is not taken for a broken one.
    """
    try:
        walk = _Walk(account_id, after)
        walk.walk_on()
        while True:
            head, balance = db.session.execute(
                select(Account.ledger_head, Account.balance).where(Account.id == account_id)
            ).one()
            db.session.commit()
            leaves = {walk.previous: walk.running, **walk.walk_on()}
            if head in leaves:
                _check_balance(balance, leaves[head])
                return None
            if leaves.keys() == {walk.previous}:
                after_id = f"after entry {walk.last_id}" if walk.last_id else "at the start"
                missing = f"its head is not its last entry's digest: entries {after_id} are missing"
                raise _BrokenAt(None, missing)
    except _BrokenAt as broken:
        return ChainProblem(account_id, broken.entry_id, broken.problem)


def _check_balance(balance: Decimal, left: Decimal) -> None:
    if balance != left:
        raise _BrokenAt(
            None,
            f"its balance is {balance:f} but its entries leave {left:f}: "
            "the balance was changed without an entry",
        )


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
