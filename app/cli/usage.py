"""``flask usage rebuild``: recompute the hourly usage rollups."""

from __future__ import annotations

import click

from app.cli.common import (
    OperatorGroup,
    operator_errors,
)
from app.generations.rollups import rebuild_rollups

usage_cli = OperatorGroup("usage", help="Keep the hourly usage rollups.")


@usage_cli.command("rebuild")
@click.option("--account", "account_id", type=int, help="Rebuild only this account's rollups.")
def rebuild_usage_command(account_id: int | None) -> None:
    """Recompute the usage rollups from the raw generations (the hours all of whose are kept)."""
    with operator_errors():
        report = rebuild_rollups(account_id=account_id)
    since = f" from {report.first_hour:%Y-%m-%d %H:00} UTC on" if report.first_hour else ""
    click.echo(
        f"rebuilt {report.rollups} hourly rollups of {report.accounts} accounts from "
        f"{report.generations} generations{since}"
    )
