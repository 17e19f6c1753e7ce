"""``flask accounts ...``: create accounts and give their holders links."""

from __future__ import annotations

from decimal import Decimal

import click

from app.accounts.links import OPERATOR_LINK_LIFETIME, invite_account_holder, issue_password_link
from app.accounts.organisations import create_account
from app.cli.common import (
    BASE_URL_OPTION,
    EMAIL,
    INITIAL_USD,
    OperatorGroup,
    link_to,
    operator_errors,
)
from app.credits import grants

accounts_cli = OperatorGroup("accounts", help="Create accounts and invite their holders.")


@accounts_cli.command("create")
@click.argument("email", type=EMAIL)
@click.option("--credits", "amount", type=INITIAL_USD, help="Initial credits in USD (0 or more).")
@click.option(
    "--admin",
    is_flag=True,
    help="Make the holder the gateway's operator, not an organisation's admin role "
    "(the operator's pages of the dashboard).",
)
def create_account_command(email: str, amount: Decimal | None, admin: bool) -> None:
    """Create an account, optionally with credits."""
    with operator_errors():
        account = create_account(email=email, is_admin=admin)
        if amount:
            grants.grant_credits(account_id=account.id, amount=amount, description="initial")
    click.echo(f"created account {account.id} {email} balance=${account.balance:f}")


@accounts_cli.command("invite")
@click.argument("email")
@BASE_URL_OPTION
def invite_command(email: str, base_url: str | None) -> None:
    """Print a one-time link, valid 24 hours, where EMAIL sets a dashboard password."""
    with operator_errors():
        token = invite_account_holder(email)
    click.echo(f"invite for {email}, valid for 24 hours and for one use:")
    click.echo(link_to(f"/password/{token}", base_url))


@accounts_cli.command("password-link")
@click.argument("email")
@BASE_URL_OPTION
def password_link_command(email: str, base_url: str | None) -> None:
    """Print a one-time link, valid 24 hours, where EMAIL sets a new dashboard password."""
    with operator_errors():
        token = issue_password_link(email, lifetime=OPERATOR_LINK_LIFETIME)
    click.echo(f"password link for {email}, valid for 24 hours and for one use:")
    click.echo(link_to(f"/password/{token}", base_url))
