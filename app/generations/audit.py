"""Check the ledger's invariants and every generation's charge against its prices."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import func, select

from app.catalog.pricing import Pricing, cost_of
from app.credits.models import CHARGE, OPEN, Account, Hold, LedgerEntry
from app.extensions import db
from app.generations.models import INTERRUPTED, Generation
from app.providers.base import Usage


@dataclass(frozen=True)
class Mismatch:
    """One broken invariant: what it concerns and how."""

    subject: str
    problem: str

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


def audit_ledger(account_ids: Collection[int] | None = None) -> AuditReport:
    """Check balance = sum of ledger, reserved = sum of open holds, and every charge.

    With ``account_ids``, only those accounts and their generations are checked.
    """
    account_mismatches, accounts = _account_mismatches(account_ids)
    generation_problems, generations = _generation_mismatches(account_ids)
    db.session.commit()
    listed: dict[type, list[Mismatch]] = {Mismatch: [], Shortfall: [], Estimated: []}
    for problem in generation_problems:
        listed[type(problem)].append(problem)
    return AuditReport(
        accounts,
        generations,
        account_mismatches + listed[Mismatch],
        listed[Shortfall],
        listed[Estimated],
    )


def _account_mismatches(account_ids: Collection[int] | None) -> tuple[list[Mismatch], int]:
    ledger = (
        select(LedgerEntry.account_id, func.sum(LedgerEntry.amount).label("total"))
        .group_by(LedgerEntry.account_id)
        .subquery()
    )
    holds = (
        select(Hold.account_id, func.sum(Hold.amount).label("total"))
        .where(Hold.status == OPEN)
        .group_by(Hold.account_id)
        .subquery()
    )
    query = (
        select(Account.id, Account.balance, Account.reserved, ledger.c.total, holds.c.total)
        .outerjoin(ledger, ledger.c.account_id == Account.id)
        .outerjoin(holds, holds.c.account_id == Account.id)
    )
    if account_ids is not None:
        query = query.where(Account.id.in_(account_ids))
    rows = db.session.execute(query).all()
    mismatches = []
    for account_id, balance, reserved, ledger_total, held_total in rows:
        mismatches.extend(
            _account_problems(account_id, balance, reserved, ledger_total, held_total)
        )
    return mismatches, len(rows)


def _account_problems(
    account_id: int,
    balance: Decimal,
    reserved: Decimal,
    ledger_total: Decimal | None,
    held_total: Decimal | None,
) -> Iterator[Mismatch]:
    ledger_sum = ledger_total or Decimal(0)
    held_sum = held_total or Decimal(0)
    subject = f"account {account_id}"
    if balance != ledger_sum:
        yield Mismatch(subject, f"balance ${balance:f} but the ledger sums to ${ledger_sum:f}")
    if reserved != held_sum:
        yield Mismatch(subject, f"reserved ${reserved:f} but open holds sum to ${held_sum:f}")
    if balance < 0:
        yield Mismatch(subject, f"negative balance ${balance:f}")


def _generation_mismatches(account_ids: Collection[int] | None) -> tuple[list[Mismatch], int]:
    charges = (
        select(LedgerEntry.generation_id, LedgerEntry.amount)
        .where(LedgerEntry.kind == CHARGE)
        .subquery()
    )
    query = select(Generation, charges.c.amount).outerjoin(
        charges, charges.c.generation_id == Generation.id
    )
    if account_ids is not None:
        query = query.where(Generation.account_id.in_(account_ids))
    mismatches, count = [], 0
    for generation, charge in db.session.execute(query.execution_options(yield_per=1000)):
        count += 1
        mismatches.extend(_generation_problems(generation, -(charge or Decimal(0))))
    return mismatches, count


def _generation_problems(generation: Generation, charged: Decimal) -> Iterator[Mismatch]:
    subject = f"generation {generation.id}"
    if generation.status == INTERRUPTED:
        yield Estimated(
            subject,
            f"charged ${generation.cost:f} for {generation.completion_tokens} completion "
            "tokens, as its stream last recorded: its worker stopped before the stream ended",
        )
    priced = cost_of(
        Usage(
            prompt_tokens=generation.prompt_tokens,
            completion_tokens=generation.completion_tokens,
            cached_tokens=generation.cached_tokens,
            prompt_image_tokens=generation.prompt_image_tokens,
            cache_write_tokens=generation.cache_write_tokens,
        ),
        Pricing(
            prompt=generation.price_prompt,
            completion=generation.price_completion,
            cached_read=generation.price_cached_read,
            image=generation.price_image,
            cache_write=generation.price_cache_write,
        ),
    )
    if generation.shortfall and generation.cost + generation.shortfall == priced:
        yield Shortfall(
            subject,
            f"priced at ${priced:f}, charged ${generation.cost:f}: "
            f"${generation.shortfall:f} unpaid",
        )
    elif generation.cost != priced:
        yield Mismatch(subject, f"cost ${generation.cost:f} but its tokens price at ${priced:f}")
    if charged != generation.cost:
        yield Mismatch(subject, f"cost ${generation.cost:f} but the ledger charged ${charged:f}")
