"""``flask keys ...``: issue, rotate, revoke, delete and list API keys.

A command that issues a key prints the value alone on the last line of stdout, so that
``KEY=$(flask keys create ... | tail -1)`` works.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

import click

from app.accounts import budgets, keys
from app.accounts.members import (
    find_member_by_email,
)
from app.auth.models import ApiKey
from app.cli.common import (
    JSON_OPTION,
    ORG_OPTION,
    USD_LIMIT,
    WINDOW_OPTION,
    ModelIds,
    OperatorGroup,
    echo_listing,
    operator_errors,
    organisation_or_account,
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
@click.argument("email", required=False)
@ORG_OPTION
@JSON_OPTION
def list_keys_command(email: str | None, org: str | None, as_json: bool) -> None:
    """List the keys of EMAIL, or of the organisation --org (of its member EMAIL if given).

    Id, name, prefix, state, created, last used, models, limit and its window.
    """
    with operator_errors():
        account = organisation_or_account(org, None if org else email)
        member_id = find_member_by_email(account.id, email).id if org and email else None
        rows = [
            _key_row(key)
            for key in keys.list_keys(account.id)
            if member_id is None or key.member_id == member_id
        ]
    echo_listing(
        rows,
        KEY_COLUMNS,
        _key_cells,
        as_json=as_json,
        empty=f"{email or account.name} has no keys",
    )


KEY_COLUMNS = ("id", "name", "prefix", "state", "created", "last_used", "models", "limit")


def _key_row(key: ApiKey) -> dict[str, object]:
    limited = key.budget is not None
    return {
        "id": key.id,
        "name": key.name,
        "prefix": f"{key.display_prefix}...",
        "state": key.state,
        "created": key.created_at.isoformat(),
        "last_used": key.last_used_at.isoformat() if key.last_used_at else None,
        "models": key.permitted_models,
        "limit": f"{key.budget:f}" if limited else None,
        "window": key.budget_window if limited else None,
    }


def _key_cells(row: Mapping[str, object]) -> list[object]:
    models = row["models"]
    limit = "none" if row["limit"] is None else f"${row['limit']} a {row['window']}"
    return [
        *(row[column] for column in KEY_COLUMNS[:5]),
        row["last_used"] or "never",
        "all" if models is None else ",".join(models),
        limit,
    ]
