"""``flask codes create`` and ``flask payments list``: redemption codes and the payments' books."""

from __future__ import annotations

from collections.abc import Mapping

import click

from app.accounts.members import find_organisation
from app.cli.common import JSON_OPTION, USD, OperatorGroup, echo_listing, operator_errors
from app.payments.books import COLUMNS, book_lines
from app.payments.codes import create_codes

codes_cli = OperatorGroup("codes", help="Make redemption codes.")
payments_cli = OperatorGroup("payments", help="List payments, refunds and codes redeemed.")


@codes_cli.command("create")
@click.option("--usd", "amount", type=USD, required=True, help="What each code is worth.")
@click.option(
    "--count", type=click.IntRange(1, 10_000), default=1, show_default=True, help="How many."
)
@click.option(
    "--expires",
    "expires_days",
    type=click.IntRange(1, 36_500),
    help="Days until the codes expire (default: never).",
)
def create_codes_command(amount, count: int, expires_days: int | None) -> None:
    """Print COUNT new codes worth USD each, one a line: shown this once, kept as digests."""
    for code in create_codes(amount, count, expires_days):
        click.echo(code)


@payments_cli.command("list")
@click.argument("org", required=False)
@JSON_OPTION
def list_payments_command(org: str | None, as_json: bool) -> None:
    """List the payments, refunds and codes redeemed of ORG (id or name), or all; newest first."""
    with operator_errors():
        account_id = find_organisation(org).id if org else None
    rows = [line.row() for line in book_lines(account_id)]
    echo_listing(rows, COLUMNS, _cells, as_json=as_json, empty="no payments")


def _cells(row: Mapping[str, object]) -> list[object]:
    return [row[column] or "-" for column in COLUMNS]
