"""``flask credits grant``: add credits to an account or organisation."""

from __future__ import annotations

import click

from app.accounts.changes import record_change
from app.cli.common import (
    ORG_OPTION,
    USD,
    OperatorGroup,
    operator_errors,
    organisation_or_account,
)
from app.credits import grants
from app.extensions import db

credits_cli = OperatorGroup("credits", help="Add credits to accounts.")


@credits_cli.command("grant")
@click.argument("target", nargs=-1, required=True, metavar="[EMAIL] AMOUNT")
@ORG_OPTION
@click.option("--idempotency-key", help="Apply this grant once, however often it is sent.")
def grant_command(target: tuple[str, ...], org: str | None, idempotency_key: str | None) -> None:
    """Add AMOUNT USD of credits to the account EMAIL, or to the organisation --org."""
    if len(target) != (1 if org else 2):
        raise click.ClickException("give EMAIL and AMOUNT, or --org and AMOUNT")
    try:
        amount = USD.convert(target[-1], None, None)
    except click.BadParameter as error:
        raise click.ClickException(error.format_message()) from None
    with operator_errors():
        account = organisation_or_account(org, target[0] if len(target) == 2 else None)
        _, applied = grants.grant_credits(
            account_id=account.id, amount=amount, idempotency_key=idempotency_key
        )
        if applied:
            record_change(None, account.id, "credits.grant", "balance", {"amount": f"{amount:f}"})
            db.session.commit()
    state = "granted" if applied else "already granted"
    db.session.refresh(account)
    whom = account.email or account.name
    click.echo(f"{state} ${amount:f} to {whom}; balance=${account.balance:f}")
