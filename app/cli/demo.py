"""``flask demo setup``: the demo account of a fresh checkout."""

from __future__ import annotations

import secrets
from decimal import Decimal

import click

from app.accounts import keys
from app.accounts.organisations import create_account, owner_membership
from app.accounts.passwords import set_password
from app.cli.common import (
    OperatorGroup,
)
from app.credits import grants
from app.credits.accounts import (
    find_account,
)

demo_cli = OperatorGroup("demo", help="Set up the demo account of a fresh checkout.")


DEMO_EMAIL = "demo@example.com"
DEMO_CREDITS = Decimal("10")


@demo_cli.command("setup")
def demo_setup_command() -> None:
    """Create the demo account with credits and print its key, once; later runs print none."""
    if find_account(DEMO_EMAIL) is not None:
        click.echo(f"the demo account {DEMO_EMAIL} exists; its key was printed when it was made")
        click.echo(f"(a new one: flask keys create {DEMO_EMAIL} --name another)")
        return
    account = create_account(email=DEMO_EMAIL)
    grants.grant_credits(account_id=account.id, amount=DEMO_CREDITS, description="demo")
    password = secrets.token_urlsafe(12)
    set_password(owner_membership(account.id).person_id, password)
    issued = keys.create_key(account_id=account.id, name="demo")
    click.echo(f"dashboard: sign in at /signin as {DEMO_EMAIL} with the password {password}")
    click.echo(f"demo account {DEMO_EMAIL} with ${DEMO_CREDITS} of credits; its API key:")
    click.echo(issued.value)
