"""``flask ledger audit``, ``verify``, ``statement``: check books and chains, sign statements."""

from __future__ import annotations

import json
from pathlib import Path

import click

from app.accounts.members import find_organisation
from app.cli.common import (
    OperatorGroup,
    operator_errors,
)
from app.credits.chain_audit import verify_chains
from app.database import utcnow
from app.generations.audit import audit_ledger
from app.ledger_statements.errors import InvalidPeriod, SigningKeyMissing
from app.ledger_statements.periods import parse_period
from app.ledger_statements.statement import signed_statement
from app.payments.audit import payment_problems

ledger_cli = OperatorGroup("ledger", help="Check the ledger's books.")


@ledger_cli.command("audit")
@click.option(
    "--account", "account_ids", type=int, multiple=True, help="Check only this account (repeat)."
)
@click.option("--full", is_flag=True, help="Re-check everything, not only what is new.")
def audit_command(account_ids: tuple[int, ...], full: bool) -> None:
    """Check balance = sum of ledger, every charge against its prices, the usage rollups.

    And that every paid order has its grant, and every grant of an order its paid order.

    Each account from its last clean checkpoint on (``--full``: from the start); exit 1
    on a mismatch. Generations charged less than their price (the balance or the key's
    limit ran out) are listed as shortfalls, and streams charged from their last recorded
    progress (their worker stopped) as estimated: the books still add up.
    """
    report = audit_ledger(account_ids or None, full=full)
    mismatches = [str(mismatch) for mismatch in report.mismatches]
    mismatches += payment_problems(list(account_ids) or None)
    for mismatch in mismatches:
        click.echo(f"mismatch: {mismatch}", err=True)
    for shortfall in report.shortfalls:
        click.echo(f"shortfall: {shortfall}")
    for estimated in report.estimated:
        click.echo(f"estimated: {estimated}")
    click.echo(
        f"checked {report.accounts} accounts and {report.generations} generations: "
        f"{len(mismatches)} mismatches, {len(report.shortfalls)} shortfalls, "
        f"{len(report.estimated)} estimated"
    )
    if mismatches:
        raise SystemExit(1)


@ledger_cli.command("verify")
@click.option(
    "--account", "account_ids", type=int, multiple=True, help="Verify only this account (repeat)."
)
def verify_command(account_ids: tuple[int, ...]) -> None:
    """Recompute every account's hash chain from its first entry; exit 1 if one is broken.

    One line per broken chain, naming its first entry that differs from what was
    chained, is missing or is out of order, or an account whose head or balance is not
    its last entry's.
    """
    report = verify_chains(list(account_ids) or None)
    for problem in report.problems:
        click.echo(f"broken: {problem}", err=True)
    click.echo(f"verified the chains of {report.accounts} accounts: {len(report.problems)} broken")
    if report.problems:
        raise SystemExit(1)


@ledger_cli.command("statement")
@click.argument("org")
@click.option(
    "--period",
    required=True,
    help="A month, YYYY-MM (UTC), or whole days, YYYY-MM-DD..YYYY-MM-DD (both included).",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Write it here, not to stdout."
)
def statement_command(org: str, period: str, out: Path | None) -> None:
    """Print the signed statement of ORG (id or name) for --period, as JSON.

    ``python tools/verify_statement.py FILE`` checks it without the database.
    """
    now = utcnow()
    with operator_errors():
        account = find_organisation(org)
        try:
            statement = signed_statement(
                account=account, period=parse_period(period, now=now), now=now
            )
        except (InvalidPeriod, SigningKeyMissing) as refused:
            raise click.ClickException(refused.message) from None
    text = json.dumps(statement, indent=2, ensure_ascii=False) + "\n"
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as error:
        raise click.ClickException(f"cannot write {out}: {error.strerror}") from None
    entries = len(statement["entries"])
    click.echo(f"wrote the statement of {account.name} for {statement['period']} to {out}")
    click.echo(f"{entries} entries, closing head {statement['closing_hash']}")
