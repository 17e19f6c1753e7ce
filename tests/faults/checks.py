"""The fault run's invariants, checked on what the callers saw and what the database holds.

Only the run's accounts are looked at: the session's database has other tests' too.
The database is read on connections of its own, opened after the run: the run ended
every connection it had on PostgreSQL.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy
from sqlalchemy import select

from app import create_app
from app.credits.models import Account, Hold, LedgerEntry
from app.generations.audit import audit_ledger
from app.generations.models import Generation, IdempotentRequest
from tests.faults.load import Attempt

ENVELOPE_FIELDS = {"message", "type", "code", "param"}


@dataclass(frozen=True)
class Books:
    """What the database holds for the run's accounts."""

    accounts: dict[int, Any]
    entries: list[Any]
    holds: list[Any]
    generations: list[Any]
    claims: list[Any]

    def generation(self, generation_id: str | None) -> Any:
        """Return the generation record ``generation_id``, or None."""
        return next((g for g in self.generations if g.id == generation_id), None)

    def charge_of(self, generation_id: str) -> Decimal | None:
        """Return what the ledger charged for ``generation_id``, or None."""
        charges = [-e.amount for e in self.entries if e.generation_id == generation_id]
        return charges[0] if charges else None

    def by_request(self) -> dict[str, list[Any]]:
        """Return the generation records by the request id that ran them."""
        found = defaultdict(list)
        for generation in self.generations:
            found[generation.request_id].append(generation)
        return found


@contextmanager
def database(database_url: str) -> Iterator[sqlalchemy.Connection]:
    """Yield a connection of its own to the run's database, closed afterwards."""
    engine = sqlalchemy.create_engine(database_url)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def read_books(database_url: str, account_ids: list[int]) -> Books:
    """Read the run's accounts' rows, ledger, holds, generations and claims."""

    def rows(table: Any, *columns: Any) -> list[Any]:
        query = select(*columns) if columns else select(table)
        return connection.execute(query.where(table.account_id.in_(account_ids))).all()

    with database(database_url) as connection:
        accounts = connection.execute(
            select(Account.id, Account.balance, Account.reserved).where(Account.id.in_(account_ids))
        ).all()
        return Books(
            accounts={row.id: row for row in accounts},
            entries=rows(LedgerEntry, *_columns(LedgerEntry, "kind", "amount", "generation_id")),
            holds=rows(Hold, *_columns(Hold, "id", "status")),
            generations=rows(
                Generation, *_columns(Generation, "id", "request_id", "cost", "status")
            ),
            claims=rows(IdempotentRequest, *_columns(IdempotentRequest, "key", "generation_id")),
        )


def _columns(model: Any, *names: str) -> list[Any]:
    """Return ``model``'s account_id column and the columns ``names``."""
    return [model.account_id, *(getattr(model, name) for name in names)]


def open_holds(database_url: str, account_ids: list[int]) -> list[str]:
    """Return the ids of the run's accounts' open holds."""
    with database(database_url) as connection:
        return list(
            connection.execute(
                select(Hold.id).where(Hold.account_id.in_(account_ids), Hold.status == "open")
            ).scalars()
        )


def audit_mismatches(database_url: str, catalog: str, books: Books) -> list[str]:
    """Check 1: the audit's mismatches that concern the run's accounts or generations."""
    app = create_app("testing", {"SQLALCHEMY_DATABASE_URI": database_url, "MODEL_CATALOG": catalog})
    with app.app_context():
        try:
            report = audit_ledger()
        finally:
            app.extensions["sqlalchemy"].engines[None].dispose()
    ours = {f"account {account_id}" for account_id in books.accounts}
    ours |= {f"generation {generation.id}" for generation in books.generations}
    return [str(mismatch) for mismatch in report.mismatches if mismatch.subject in ours]


def balances(books: Books) -> list[str]:
    """Check 2: each balance is its grants less its charges, and never negative."""
    problems = []
    for account_id, account in books.accounts.items():
        ledger = sum((e.amount for e in books.entries if e.account_id == account_id), Decimal(0))
        if account.balance != ledger:
            problems.append(f"account {account_id}: balance {account.balance}, ledger {ledger}")
        if account.balance < 0 or account.reserved < 0:
            problems.append(f"account {account_id}: {account.balance} / {account.reserved}")
    return problems


def answered_costs(books: Books, attempts: list[Attempt]) -> list[str]:
    """Check 3: every cost told to a caller is its generation's cost and its ledger charge."""
    problems = []
    for attempt in attempts:
        if attempt.cost is None:
            continue
        generation = books.generation(attempt.generation_id)
        recorded = generation.cost if generation is not None else None
        charged = books.charge_of(attempt.generation_id) or Decimal(0)
        if not attempt.cost == recorded == charged:
            problems.append(
                f"{attempt.request_id} ({describe(attempt)}): told {attempt.cost}, generation "
                f"{attempt.generation_id} recorded {recorded}, ledger charged {charged}"
            )
    return problems


def keys_charged_once(books: Books, attempts: list[Attempt]) -> list[str]:
    """Check 4: each Idempotency-Key's attempts ran at most one charged generation."""
    by_request = books.by_request()
    claims = {(claim.account_id, claim.key): claim.generation_id for claim in books.claims}
    by_key: dict[str, list[Attempt]] = defaultdict(list)
    for attempt in attempts:
        if attempt.key is not None:
            by_key[attempt.key].append(attempt)
    problems = []
    for key, tries in by_key.items():
        charged = {g.id for a in tries for g in by_request.get(a.request_id, ()) if g.cost > 0}
        claim = claims.get((tries[0].account_id, key))
        answered = {a.generation_id for a in tries if a.status == 200}
        if len(charged) > 1 or (charged and claim not in charged) or answered - charged:
            problems.append(
                f"key {key}: charged generations {sorted(charged)}, claim names {claim}, "
                f"answers name {sorted(answered)}; attempts: "
                + ", ".join(f"{a.request_id} {describe(a)}" for a in tries)
            )
    return problems


def broken_streams_billed(books: Books, attempts: list[Attempt]) -> list[str]:
    """Check 5: a stream that delivered text before it broke is charged.

    Its progress is recorded before its first output goes out, so even a worker killed
    in its first second leaves a record the hold is settled from.
    """
    by_request = books.by_request()
    problems = []
    for attempt in attempts:
        if not attempt.streamed or attempt.outcome == "done":
            continue
        if attempt.texts == 0:
            continue
        records = by_request.get(attempt.request_id, [])
        if not any(g.cost > 0 for g in records):
            problems.append(
                f"{attempt.request_id} ({describe(attempt)}): {attempt.outcome} after "
                f"{attempt.delivered_seconds:.2f}s of text ({attempt.texts} chunks), records "
                + str([(g.id, g.status, g.cost) for g in records])
            )
    return problems


def no_open_holds(remaining: list[str]) -> list[str]:
    """Check 6: no hold of the run's accounts is open after the TTL."""
    return [f"hold {hold_id} still open" for hold_id in remaining]


def errors_in_envelope(attempts: list[Attempt], excused: Callable[[Attempt], bool]) -> list[str]:
    """Check 7: every error is the envelope, and none is the server's own failure.

    A 500 that ``excused`` accepts is none: see ``killed_in_use``.
    """
    problems = []
    for attempt in attempts:
        errors = list(attempt.sse_errors)
        if attempt.status is not None and attempt.status != 200:
            errors.append(attempt.error_body)
        subject = f"{attempt.request_id} ({describe(attempt)})"
        for error in errors:
            if not is_envelope(error):
                problems.append(f"{subject}: not the envelope: {error!r}")
            elif is_server_error(attempt, error) and not excused(attempt):
                problems.append(f"{subject}: {error['error']}")
    return problems


def is_server_error(attempt: Attempt, error: dict) -> bool:
    """Tell whether ``error`` is the server's own failure (a 5xx, or one in a stream)."""
    return error["error"]["code"] == "server_error" or (attempt.status or 0) >= 500


def killed_in_use(logs: str, terminations: list[tuple[float, float]]) -> Callable[[Attempt], bool]:
    """Return whether a 500 came of a connection the run terminated while the request ran.

    Statements read in the request's session are not run again (only those run alone
    and transactions are): one whose connection is ended under it, between the ping
    before its use and its answer, fails its request. A connection that died idle never
    may, nor may a stream's settlement (a server error in a stream), nor a request that
    began after the connections were terminated.
    """

    def excused(attempt: Attempt) -> bool:
        ended = attempt.ended_at if attempt.ended_at is not None else float("inf")
        overlapped = any(attempt.started <= end and ended >= begin for begin, end in terminations)
        return (
            attempt.status == 500
            and overlapped
            and ADMIN_TERMINATION in failure_in_log(logs, attempt.request_id)
        )

    return excused


ADMIN_TERMINATION = "terminating connection due to administrator command"


def failure_in_log(logs: str, request_id: str) -> str:
    """Return the traceback gunicorn's log has for ``request_id``'s unhandled error."""
    start = logs.find(f"[{request_id}] unhandled error while serving a request")
    if start < 0:
        return ""
    # The traceback runs until the next line of the log, which starts with its date.
    following = re.search(r"\n\d{4}-\d\d-\d\d ", logs[start:])
    return logs[start : start + following.start()] if following else logs[start:]


# What gevent writes when a greenlet dies of an error, and what a worker's loops write
# when one of their duties raised one they do not expect (app.sweeper.run_duties).
DUTY_FAILURES = re.compile(r"<Greenlet at [^\n]*? failed with \w+|.* failed unexpectedly; .*")


def duties_failed(logs: str) -> list[str]:
    """Check 9: no background loop of a worker (renewals, sweeper, alerts) met an unexpected error.

    A renewal loop that died would let its worker's running requests' holds expire, and
    its streams go unbilled if the worker is killed.
    """
    return [match.group(0) for match in DUTY_FAILURES.finditer(logs)]


def is_envelope(body: Any) -> bool:
    """Tell whether ``body`` is ``{"error": {"message", "type", "code", "param"}}``."""
    return (
        isinstance(body, dict)
        and set(body) == {"error"}
        and isinstance(body["error"], dict)
        and set(body["error"]) == ENVELOPE_FIELDS
    )


def describe(attempt: Attempt) -> str:
    """Say in a few words what an attempt was and how it ended."""
    kind = "stream" if attempt.streamed else "whole"
    key = f" key {attempt.key}" if attempt.key else ""
    return f"{kind}{key}, account {attempt.account_id}, {attempt.status} {attempt.outcome}"


Check = tuple[str, Callable[[], list[str]]]


def run_checks(checks: list[Check]) -> list[tuple[str, list[str]]]:
    """Run every check; return those that found problems, with their problems."""
    failed = []
    for name, check in checks:
        if problems := check():
            failed.append((name, problems))
    return failed
