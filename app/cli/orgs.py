"""``flask orgs ...``: organisations, their members and budgets."""

from __future__ import annotations

import smtplib
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal

import click

from app.accounts import budgets, keys
from app.accounts.invites import mail_invite
from app.accounts.members import (
    OPERATOR,
    create_organisation,
    find_member_by_email,
    find_organisation,
    invite_member,
    list_members,
    remove_member,
)
from app.accounts.models import ROLES, Membership
from app.accounts.organisations import organisation_label
from app.budgets import BudgetState, budget_state
from app.cli.common import (
    BASE_URL_OPTION,
    EMAIL,
    INITIAL_USD,
    JSON_OPTION,
    USD_OR_NONE,
    WINDOW_OPTION,
    OperatorGroup,
    echo_listing,
    link_to,
    operator_errors,
)
from app.credits import grants
from app.credits.models import Account
from app.database import utcnow
from app.mail import mail_configured

# Who an operator's invite is from, in its mail: nobody the invitee knows by address.
OPERATOR_NAME = "The gateway's operator"

orgs_cli = OperatorGroup("orgs", help="Create organisations, their members and budgets.")


@orgs_cli.command("create")
@click.argument("name")
@click.option("--owner", "owner_email", type=EMAIL, required=True, help="The owner's email.")
@click.option("--credits", "amount", type=INITIAL_USD, help="Initial credits in USD (0 or more).")
def create_organisation_command(name: str, owner_email: str, amount: Decimal | None) -> None:
    """Create the organisation NAME owned by --owner (a new person sets a password by invite)."""
    with operator_errors():
        account = create_organisation(name=name, owner_email=owner_email, actor=None)
        if amount:
            grants.grant_credits(account_id=account.id, amount=amount, description="initial")
    click.echo(f"created organisation {account.id} {account.name!r} owned by {owner_email}")


@orgs_cli.command("invite")
@click.argument("org")
@click.argument("email", type=EMAIL)
@click.option("--role", type=click.Choice(ROLES), default="member", show_default=True)
@BASE_URL_OPTION
def invite_member_command(org: str, email: str, role: str, base_url: str | None) -> None:
    """Invite EMAIL into ORG (id or name) by a one-time link, valid 24 hours.

    The link is mailed to EMAIL when SMTP_URL is set, and printed on the last line.
    """
    with operator_errors():
        account = find_organisation(org)
        token = invite_member(account.id, OPERATOR, email=email, role=role)
    link = link_to(f"/invite/{token}", base_url)
    sent = ", mailed to " + email if mail_configured() and _mailed(email, account, link) else ""
    click.echo(
        f"invite for {email} to {account.name} as {role}, valid 24 hours, for one use{sent}:"
    )
    click.echo(link)


def _mailed(email: str, account: Account, link: str) -> bool:
    """Mail the invite's link; False, with a warning on stderr, if the server failed."""
    try:
        mail_invite(
            email=email,
            organisation=organisation_label(account.name, account.email, None),
            inviter=OPERATOR_NAME,
            link=link,
        )
    except (smtplib.SMTPException, OSError) as error:
        click.echo(
            f"the invite could not be e-mailed ({type(error).__name__}): give the link yourself",
            err=True,
        )
        return False
    return True


@orgs_cli.command("members")
@click.argument("org")
@JSON_OPTION
def list_members_command(org: str, as_json: bool) -> None:
    """List ORG's members (id or name).

    Member id, role, email, since when, then the budget (or none), its window and what
    was spent in the window so far.
    """
    with operator_errors():
        account = find_organisation(org)
        listed = list_members(account.id)
    now = utcnow()
    rows = [
        _member_row(row.membership, row.email, budget_state(row.membership, now)) for row in listed
    ]
    echo_listing(
        rows, MEMBER_COLUMNS, _member_cells, as_json=as_json, empty=f"{account.name} has no members"
    )


MEMBER_COLUMNS = ("id", "role", "email", "since", "budget", "window", "spent")


def _member_row(member: Membership, email: str, budget: BudgetState) -> dict[str, object]:
    return {
        "id": member.id,
        "role": member.role,
        "email": email,
        "since": member.created_at.isoformat(),
        "budget": None if budget.amount is None else f"{budget.amount:f}",
        "window": budget.window,
        "spent": f"{budget.spent:f}",
    }


def _member_cells(row: Mapping[str, object]) -> list[object]:
    since = datetime.fromisoformat(str(row["since"]))
    budget = "none" if row["budget"] is None else f"${row['budget']}"
    return [
        row["id"],
        row["role"],
        row["email"],
        f"{since:%Y-%m-%d %H:%M}",
        budget,
        row["window"],
        f"${row['spent']}",
    ]


@orgs_cli.command("remove")
@click.argument("org")
@click.argument("email")
def remove_member_command(org: str, email: str) -> None:
    """Remove EMAIL from ORG (id or name): their keys are revoked at once."""
    with operator_errors():
        account = find_organisation(org)
        revoked = remove_member(account.id, OPERATOR, find_member_by_email(account.id, email).id)
    click.echo(f"removed {email} from {account.name}; revoked {revoked} keys")


@orgs_cli.command("budget")
@click.argument("org")
@click.argument("email", required=False)
@click.option("--usd", "amount", type=USD_OR_NONE, required=True, help="USD a window, or none.")
@WINDOW_OPTION
@click.option("--key", "key_id", type=int, help="Set the budget of this key of ORG instead.")
def budget_command(
    org: str, email: str | None, amount: Decimal | None, window: str, key_id: int | None
) -> None:
    """Set (or with --usd none, remove) the budget of ORG's member EMAIL, or of a key.

    ORG is the organisation's id or name. A member's budget counts the spend of all
    their keys.
    """
    if (email is None) == (key_id is None):
        raise click.UsageError("name either a member's EMAIL or --key")
    with operator_errors():
        account = find_organisation(org)
        if email is not None:
            member = find_member_by_email(account.id, email)
            budgets.set_member_budget(member.id, amount=amount, window=window)
            subject = f"member {email}"
        else:
            _refuse_foreign_key(account, key_id)
            budgets.set_key_budget(key_id, amount=amount, window=window, account_id=account.id)
            subject = f"key {key_id}"
    state = "no budget" if amount is None else f"${amount:f} a {window}"
    click.echo(f"{subject} of {account.name}: {state}")


def _refuse_foreign_key(account: Account, key_id: int) -> None:
    """Say so when key ``key_id`` exists but is another organisation's."""
    owner_id = keys.organisation_of_key(key_id)
    if owner_id != account.id:
        raise click.ClickException(
            f"API key {key_id} belongs to another organisation (id {owner_id}), not {account.name}"
        )
