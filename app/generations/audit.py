"""Check the ledger's invariants, every generation's charge, and the rollups of generations.

An audit checks each account's books from its last clean checkpoint on: its balance
against the ledger (the sum up to the checkpoint, plus the entries after it), its open
holds, the generations recorded since, and the usage rollups of the hours since, against
their generations. A clean account's checkpoint then moves to the rows written an hour
(SETTLING) before the audit began, which are surely committed; an account with a
mismatch keeps its checkpoint, so that the mismatch is reported again until it is mended.
``full`` re-checks everything, whatever the checkpoints say.

The generations are re-priced in SQL, and only those it finds charged otherwise than at
their prices (or short, or estimated, or with lines SQL does not price: hosted tool calls,
a tier's multiplier other than 1) are read and re-priced in Python, which words the
report: an audit reads what changed since its checkpoint, not the whole history. Rows
changed in place after they were checked are found by a full audit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    BigInteger,
    and_,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    or_,
    select,
    type_coerce,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import aliased

from app.catalog.pricing import cost_of
from app.credits.budget_audit import budget_mismatches
from app.credits.chain_audit import verify_chains
from app.credits.models import CHARGE, OPEN, Account, Hold, LedgerEntry
from app.credits.settlement import hour_of
from app.database import utcnow, write_transaction
from app.extensions import db
from app.generations.lifecycle import recorded_usage
from app.generations.models import INTERRUPTED, AuditCheckpoint, Generation
from app.generations.rollups import rollup_mismatches
from app.money import UNITS_PER_USD

# A row written this long before an audit began is committed by the time it reads: a
# checkpoint covers only such rows, so that none still being written is passed over.
SETTLING = timedelta(hours=1)
# Accounts checked per query.
CHUNK = 500
# The columns of a generation that say what it used and what each line was priced at.
RECORDED_PRICING = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "prompt_image_tokens",
    "cache_write_tokens",
    "cache_write_1h_tokens",
    "tool_calls",
    "price_prompt",
    "price_completion",
    "price_cached_read",
    "price_image",
    "price_cache_write",
    "price_cache_write_1h",
)


@dataclass(frozen=True)
class Mismatch:
    """One broken invariant: what it concerns and how; and whose account it is."""

    subject: str
    problem: str
    account_id: int | None = None

    def __str__(self) -> str:
        """Render as one line for the operator."""
        return f"{self.subject}: {self.problem}"


class Shortfall(Mismatch):
    """A generation charged less than its price because the balance or key limit ran out."""


class Estimated(Mismatch):
    """A stream charged from its last recorded progress: its worker stopped before its end."""


@dataclass(frozen=True)
class AuditReport:
    """What was checked, what did not add up, and which generations were not paid in full.

    A shortfall is no mismatch: the books add up, but the balance (or the key's monthly
    limit) could not cover what the usage priced at beyond its hold. Neither is an
    estimated charge: a stream whose worker stopped was charged what it was last
    recorded to have delivered, which may be a little less than it did.
    """

    accounts: int
    generations: int
    mismatches: list[Mismatch]
    shortfalls: list[Mismatch] = field(default_factory=list)
    estimated: list[Mismatch] = field(default_factory=list)


@dataclass(frozen=True)
class _Scope:
    """The accounts audited together: those whose generations are checked from ``since``."""

    account_ids: list[int]
    since: datetime | None
    full: bool


def audit_ledger(account_ids: Collection[int] | None = None, *, full: bool = False) -> AuditReport:
    """Check balance = sum of ledger, reserved = sum of open holds, every charge, the rollups.

    With ``account_ids``, only those accounts. Each account from its last clean
    checkpoint on, or from the start with ``full`` (or without a checkpoint).
    """
    horizon = utcnow() - SETTLING
    found: dict[type, list[Mismatch]] = {Mismatch: [], Shortfall: [], Estimated: []}
    accounts = generations = 0
    for scope in _scopes(account_ids, full):
        problems, checked = _audit_scope(scope)
        accounts, generations = accounts + len(scope.account_ids), generations + checked
        for problem in problems:
            found[type(problem)].append(problem)
        _move_checkpoints(scope, problems, horizon)
    return AuditReport(accounts, generations, found[Mismatch], found[Shortfall], found[Estimated])


def _scopes(account_ids: Collection[int] | None, full: bool) -> Iterator[_Scope]:
    """Yield the accounts to audit, CHUNK at a time, grouped by where their checks start."""
    query = select(Account.id, AuditCheckpoint.checked_until).outerjoin(
        AuditCheckpoint, AuditCheckpoint.account_id == Account.id
    )
    if account_ids is not None:
        query = query.where(Account.id.in_(list(account_ids)))
    starts: dict[datetime | None, list[int]] = defaultdict(list)
    for account_id, checked_until in db.session.execute(query.order_by(Account.id)):
        starts[None if full else checked_until].append(account_id)
    db.session.commit()
    for since, ids in starts.items():
        for first in range(0, len(ids), CHUNK):
            yield _Scope(ids[first : first + CHUNK], since, full or since is None)


def _audit_scope(scope: _Scope) -> tuple[list[Mismatch], int]:
    """Return what is wrong with the scope's accounts, and how many generations were checked."""
    problems = list(_account_mismatches(scope))
    generation_problems, checked = _generation_mismatches(scope)
    first_hour = None if scope.since is None else hour_of(scope.since)
    rollup_problems = [
        Mismatch(subject, problem, account_id)
        for account_id, subject, problem in rollup_mismatches(scope.account_ids, first_hour)
    ]
    budget_problems = [
        Mismatch(subject, problem, account_id)
        for account_id, subject, problem in budget_mismatches(scope.account_ids)
    ]
    db.session.commit()
    problems += generation_problems + rollup_problems + budget_problems
    return problems + _chain_mismatches(scope), checked


def _chain_mismatches(scope: _Scope) -> list[Mismatch]:
    """Verify the accounts' hash chains, each from its checkpoint's last entry on."""
    after = {}
    if not scope.full:
        checkpoints = select(AuditCheckpoint.account_id, AuditCheckpoint.ledger_entry_id).where(
            AuditCheckpoint.account_id.in_(scope.account_ids), AuditCheckpoint.ledger_entry_id > 0
        )
        after = dict(db.session.execute(checkpoints).all())
        db.session.commit()
    report = verify_chains(scope.account_ids, after=after)
    return [
        Mismatch(f"chain of {broken.where}", broken.problem, broken.account_id)
        for broken in report.problems
    ]


def _account_mismatches(scope: _Scope) -> Iterator[Mismatch]:
    """Check each account's balance against its ledger, and what it reserves against its holds.

    One statement, so that the balance and the ledger are read at one moment: the ledger
    is the checkpoint's sum plus the entries after its last one.
    """
    last_entry = literal(0) if scope.full else func.coalesce(AuditCheckpoint.ledger_entry_id, 0)
    later = (
        select(func.sum(LedgerEntry.amount))
        .where(LedgerEntry.account_id == Account.id, LedgerEntry.id > last_entry)
        .scalar_subquery()
    )
    holds = (
        select(Hold.account_id, func.sum(Hold.amount).label("total"))
        .where(Hold.status == OPEN, Hold.account_id.in_(scope.account_ids))
        .group_by(Hold.account_id)
        .subquery()
    )
    query = (
        select(
            Account.id,
            Account.balance,
            Account.reserved,
            AuditCheckpoint.ledger_sum,
            later,
            holds.c.total,
        )
        .outerjoin(AuditCheckpoint, AuditCheckpoint.account_id == Account.id)
        .outerjoin(holds, holds.c.account_id == Account.id)
        .where(Account.id.in_(scope.account_ids))
    )
    for account_id, balance, reserved, summed, added, held in db.session.execute(query):
        ledger_sum = (Decimal(0) if scope.full else summed or Decimal(0)) + (added or Decimal(0))
        yield from _account_problems(account_id, balance, reserved, ledger_sum, held)


def _account_problems(
    account_id: int,
    balance: Decimal,
    reserved: Decimal,
    ledger_sum: Decimal,
    held_total: Decimal | None,
) -> Iterator[Mismatch]:
    held_sum = held_total or Decimal(0)
    subject = f"account {account_id}"
    if balance != ledger_sum:
        problem = f"balance ${balance:f} but the ledger sums to ${ledger_sum:f}"
        yield Mismatch(subject, problem, account_id)
    if reserved != held_sum:
        problem = f"reserved ${reserved:f} but open holds sum to ${held_sum:f}"
        yield Mismatch(subject, problem, account_id)
    # A balance below zero is a debt (a payment taken back after its credit was spent),
    # not a broken book: the ledger's sum, checked above, accounts for it.


def _units(column: Any) -> Any:
    """``column`` as the integer it is stored as (money in units of 1e-10 USD)."""
    return type_coerce(column, BigInteger)


def priced_in_sql() -> Any:
    """Return a generation's price in money units, computed in SQL exactly as cost_of does.

    Each price (units per million tokens) is split into whole units per token and the
    rest, so that no product outgrows 64 bits; the rest is rounded half up once, as
    to_money rounds the exact sum (all of it is positive).
    """
    # Token counts are 32-bit columns: their sums and products are taken in 64 bits.
    prompt, cached, cache_write, cache_write_1h, image, completion = (
        cast(column, BigInteger)
        for column in (
            Generation.prompt_tokens,
            Generation.cached_tokens,
            Generation.cache_write_tokens,
            Generation.cache_write_1h_tokens,
            Generation.prompt_image_tokens,
            Generation.completion_tokens,
        )
    )
    plain = prompt - cached - cache_write - image
    terms = (
        (case((plain > 0, plain), else_=0), Generation.price_prompt),
        (cached, Generation.price_cached_read),
        (cache_write - cache_write_1h, Generation.price_cache_write),
        (cache_write_1h, Generation.price_cache_write_1h),
        (image, Generation.price_image),
        (completion, Generation.price_completion),
    )
    million = literal(1_000_000, BigInteger)
    whole = [tokens * (_units(price) // million) for tokens, price in terms]
    rest = [tokens * (_units(price) % million) for tokens, price in terms]
    return (
        sum(whole[1:], whole[0])
        + (sum(rest[1:], rest[0]) + literal(500_000, BigInteger)) // million
    )


def _generation_mismatches(scope: _Scope) -> tuple[list[Mismatch], int]:
    """Check the scope's generations since its start; return their problems and count.

    SQL picks the generations whose charge differs from their price or from the ledger's
    charge, or that were short or estimated; Python re-prices those and words them.
    """
    recorded = [Generation.account_id.in_(scope.account_ids)]
    if scope.since is not None:
        recorded.append(Generation.created_at >= scope.since)
    count = db.session.scalar(select(func.count()).select_from(Generation).where(*recorded))
    charged = func.coalesce(-_units(LedgerEntry.amount), 0)
    suspect = or_(
        Generation.status == INTERRUPTED,
        _units(Generation.shortfall) != 0,
        # Tool calls (JSON) and a tier's multiplier are priced in Python alone.
        Generation.tool_calls.is_not(None),
        _units(Generation.tier_multiplier) != UNITS_PER_USD,
        _units(Generation.cost) != priced_in_sql(),
        _units(Generation.cost) != charged,
    )
    query = (
        select(Generation, LedgerEntry.amount)
        .outerjoin(
            LedgerEntry,
            and_(LedgerEntry.generation_id == Generation.id, LedgerEntry.kind == CHARGE),
        )
        .where(*recorded, suspect)
    )
    problems = []
    for generation, charge in db.session.execute(query.execution_options(yield_per=1000)):
        problems.extend(_generation_problems(generation, -(charge or Decimal(0))))
    return problems, count


def _generation_problems(generation: Generation, charged: Decimal) -> Iterator[Mismatch]:
    subject, account_id = f"generation {generation.id}", generation.account_id
    if generation.status == INTERRUPTED:
        yield Estimated(
            subject,
            f"charged ${generation.cost:f} for {generation.completion_tokens} completion "
            "tokens, estimated from its stream's last recorded progress (at the most its "
            "request could use, when the upstream had not ended it): its worker stopped "
            "before the stream ended",
            account_id,
        )
    usage, pricing = recorded_usage(
        {column: getattr(generation, column) for column in RECORDED_PRICING}
    )
    priced = cost_of(usage, pricing, generation.tier_multiplier)
    if generation.shortfall and generation.cost + generation.shortfall == priced:
        problem = (
            f"priced at ${priced:f}, charged ${generation.cost:f}: ${generation.shortfall:f} unpaid"
        )
        yield Shortfall(subject, problem, account_id)
    elif generation.cost != priced:
        problem = f"cost ${generation.cost:f} but its tokens price at ${priced:f}"
        yield Mismatch(subject, problem, account_id)
    if charged != generation.cost:
        problem = f"cost ${generation.cost:f} but the ledger charged ${charged:f}"
        yield Mismatch(subject, problem, account_id)


def _move_checkpoints(scope: _Scope, problems: list[Mismatch], horizon: datetime) -> None:
    """Move the checkpoints of the scope's accounts found clean to ``horizon``."""
    troubled = {problem.account_id for problem in problems if type(problem) is Mismatch}
    clean = [account_id for account_id in scope.account_ids if account_id not in troubled]
    if clean:
        write_transaction(
            lambda connection: _write_checkpoints(connection, clean, scope.full, horizon)
        )


def _write_checkpoints(
    connection: Connection, account_ids: list[int], full: bool, horizon: datetime
) -> None:
    """Replace the accounts' checkpoints: the ledger up to its last entry before ``horizon``.

    A full audit sums the ledger from its first entry again.
    """
    old_last = literal(0) if full else func.coalesce(AuditCheckpoint.ledger_entry_id, 0)
    old_sum = (
        literal(0, BigInteger) if full else func.coalesce(_units(AuditCheckpoint.ledger_sum), 0)
    )
    entry = aliased(LedgerEntry)
    new_last = func.coalesce(
        select(func.max(entry.id))
        .where(entry.account_id == Account.id, entry.id > old_last, entry.created_at < horizon)
        # Read inside the sum's subquery too: the account and checkpoint are the outer ones.
        .correlate_except(entry)
        .scalar_subquery(),
        old_last,
    )
    added = (
        select(func.sum(_units(LedgerEntry.amount)))
        .where(
            LedgerEntry.account_id == Account.id,
            LedgerEntry.id > old_last,
            LedgerEntry.id <= new_last,
        )
        .scalar_subquery()
    )
    rows = connection.execute(
        select(Account.id, new_last, old_sum + func.coalesce(added, 0))
        .outerjoin(AuditCheckpoint, AuditCheckpoint.account_id == Account.id)
        .where(Account.id.in_(account_ids))
    ).all()
    connection.execute(delete(AuditCheckpoint).where(AuditCheckpoint.account_id.in_(account_ids)))
    now = utcnow()
    connection.execute(
        insert(AuditCheckpoint.__table__).values(
            [
                {
                    "account_id": account_id,
                    "ledger_entry_id": last,
                    "ledger_sum": Decimal(units) / UNITS_PER_USD,
                    "checked_until": horizon,
                    "checked_at": now,
                }
                for account_id, last, units in rows
            ]
        )
    )
