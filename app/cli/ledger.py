"""``flask ledger audit``, ``flask ledger verify``: check the ledger's books and its chains."""

from __future__ import annotations

import click

from app.cli.common import (
    OperatorGroup,
)
from app.credits.chain_audit import verify_chains
from app.generations.audit import audit_ledger
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
