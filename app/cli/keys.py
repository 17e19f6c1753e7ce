"""``flask keys ...``: issue, rotate, revoke, delete and list API keys.

A command that issues a key prints the value alone on the last line of stdout, so that
``KEY=$(flask keys create ... | tail -1)`` works.
"""

from __future__ import annotations

from decimal import Decimal

import click

from app.accounts import budgets, keys
from app.accounts.members import (
    find_member_by_email,
)
from app.budgets import MONTH
from app.cli.common import (
    ORG_OPTION,
    USD_LIMIT,
    WINDOW_OPTION,
    ModelIds,
    OperatorGroup,
    operator_errors,
    organisation_or_account,
)
from app.credits.accounts import (
    find_account_or_raise,
)

keys_cli = OperatorGroup("keys", help="Issue, rotate, revoke, delete and list API keys.")


@keys_cli.command("create")
@click.argument("email", required=False)
@ORG_OPTION
@click.option("--name", required=True, help="A name to recognise the key by.")
@click.option("--models", type=ModelIds(), help="Comma-separated model ids the key may use.")
@click.option("--monthly-limit", type=USD_LIMIT, help="USD the key may spend per month (UTC).")
@click.option("--limit", type=USD_LIMIT, help="USD the key may spend per window (--per).")
@WINDOW_OPTION
def create_key_command(
    email: str | None,
    org: str | None,
    name: str,
    models: list[str] | None,
    monthly_limit: Decimal | None,
    limit: Decimal | None,
    window: str,
) -> None:
    """Issue a key; its value is printed once, alone on the last line.

    Without --org, the key is the account EMAIL's (its owner's). With --org, it belongs
    to the organisation's member EMAIL, or to its owner if EMAIL is left out.
    """
    if limit is not None and monthly_limit is not None:
        raise click.UsageError("give either --monthly-limit or --limit")
    with operator_errors():
        account = organisation_or_account(org, None if org else email)
        member_id = find_member_by_email(account.id, email).id if org and email else None
        budgets.checked_budget_amount(limit)  # before the key is issued: nothing half-written
        issued = keys.create_key(
            account_id=account.id,
            member_id=member_id,
            name=name,
            permitted_models=models,
            monthly_limit=monthly_limit,
        )
        if limit is not None:
            budgets.set_key_budget(issued.id, amount=limit, window=window)
    click.echo(f"created key {issued.id} ({issued.display_prefix}...) for {email or account.name}")
    click.echo(issued.value)


@keys_cli.command("rotate")
@click.argument("key_id", type=int)
def rotate_key_command(key_id: int) -> None:
    """Give KEY_ID a new value (printed once, on the last line); the old one fails at once."""
    with operator_errors():
        issued = keys.rotate_key(key_id)
    click.echo(f"rotated key {issued.id} ({issued.display_prefix}...)")
    click.echo(issued.value)


@keys_cli.command("revoke")
@click.argument("key_id", type=int)
def revoke_key_command(key_id: int) -> None:
    """Revoke KEY_ID: kept, but refused with 403."""
    with operator_errors():
        keys.revoke_key(key_id)
    click.echo(f"revoked key {key_id}")


@keys_cli.command("delete")
@click.argument("key_id", type=int)
def delete_key_command(key_id: int) -> None:
    """Delete KEY_ID for good."""
    with operator_errors():
        keys.delete_key(key_id)
    click.echo(f"deleted key {key_id}")


@keys_cli.command("list")
@click.argument("email")
def list_keys_command(email: str) -> None:
    """List the keys of EMAIL: id, name, prefix, state, created, last used, models, limit."""
    with operator_errors():
        rows = keys.list_keys(find_account_or_raise(email).id)
    click.echo("id\tname\tprefix\tstate\tcreated\tlast_used\tmodels\tmonthly_limit")
    for key in rows:
        last_used = key.last_used_at.isoformat() if key.last_used_at else "never"
        models = ",".join(key.permitted_models) if key.permitted_models is not None else "all"
        limit = "none" if key.budget is None else f"${key.budget:f}"
        if key.budget is not None and key.budget_window != MONTH:
            limit += f" a {key.budget_window}"
        click.echo(
            f"{key.id}\t{key.name}\t{key.display_prefix}...\t{key.state}\t"
            f"{key.created_at.isoformat()}\t{last_used}\t{models}\t{limit}"
        )
