"""What several command groups share: the USD amount parser, options, error printing."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from decimal import Decimal, InvalidOperation

import click
from flask import current_app
from flask.cli import AppGroup

from app.accounts.errors import (
    AlreadyMember,
    InvalidKeyLimits,
    KeyNotFound,
    LastOwner,
    MemberNotFound,
    OrganisationNameRefused,
)
from app.accounts.members import find_organisation
from app.accounts.organisations import is_email_address
from app.alerts.endpoints import (
    EndpointNotFound,
    InvalidAlertSetting,
)
from app.budgets import MONTH, WINDOWS
from app.credits.accounts import (
    AccountExists,
    AccountNotFound,
    find_account_or_raise,
)
from app.credits.errors import GrantOutOfRange, IdempotencyConflict
from app.credits.models import Account
from app.money import MAX_MONEY, MONEY_QUANTUM, exact_money


class OperatorCommand(click.Command):
    """A command that refuses wrong input in one line on stderr, as deploy scripts expect.

    click would print the usage and a hint around the error; the operator interface
    promises the error alone.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Parse as click does, turning a usage error into a one-line error."""
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as error:
            raise click.ClickException(error.format_message()) from None


class OperatorGroup(AppGroup):
    """A command group whose commands are OperatorCommands."""

    command_class = OperatorCommand


class UsdAmount(click.ParamType):
    """A USD amount, parsed exactly, as the ledger can hold it: every command's amounts.

    An amount past what a Money column holds, or finer than its 1e-10 USD, is refused
    here, before anything is written (the domain checks its own bounds on top).
    ``allow_zero``: 0 is an amount (initial credits, a limit of nothing); ``allow_none``:
    ``none`` stands for no amount.
    """

    name = "usd"

    def __init__(self, *, allow_zero: bool = False, allow_none: bool = False) -> None:
        self.allow_zero = allow_zero
        self.allow_none = allow_none

    def convert(self, value: object, param: object, ctx: object) -> Decimal | None:
        """Parse ``value`` as an exact Decimal amount, or None for ``none`` if allowed."""
        text = str(value).strip()
        if self.allow_none and (value is None or text.lower() == "none"):
            return None
        try:
            amount = Decimal(text)
        except InvalidOperation:
            amount = Decimal("NaN")
        if not amount.is_finite():
            self.fail(f"{value!r} is not an amount in USD")
        if amount < 0 and self.allow_zero:
            self.fail(f"{value!r} must not be negative")
        if amount < 0 or (amount == 0 and not self.allow_zero):
            self.fail(f"{value!r} must be a positive amount in USD")
        if amount > MAX_MONEY:
            self.fail(f"{value!r} is more than the ledger holds: at most {MAX_MONEY} USD")
        if not exact_money(amount):
            self.fail(f"{value!r} is finer than the ledger keeps: {MONEY_QUANTUM} USD")
        return amount


USD = UsdAmount()
# An account created without --credits starts at 0, so --credits 0 says the same thing.
INITIAL_USD = UsdAmount(allow_zero=True)
USD_LIMIT = UsdAmount(allow_zero=True)
USD_OR_NONE = UsdAmount(allow_zero=True, allow_none=True)


class EmailAddress(click.ParamType):
    """One e-mail address, for a command that makes a person or invites one."""

    name = "email"

    def convert(self, value: object, param: object, ctx: object) -> str:
        """Return ``value`` trimmed if it reads as one e-mail address."""
        if not is_email_address(str(value)):
            self.fail(f"{value!r} is not an e-mail address")
        return str(value).strip()


EMAIL = EmailAddress()


class PercentOrNone(click.ParamType):
    """A whole percentage as written, for the domain to check, or ``none``."""

    name = "percent"

    def convert(self, value: object, param: object, ctx: object) -> int | None:
        """Parse ``value`` as an integer; ``none`` is None."""
        if value is None or str(value).strip().lower() == "none":
            return None
        try:
            return int(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a whole percentage")


WINDOW_OPTION = click.option(
    "--per",
    "window",
    type=click.Choice(WINDOWS),
    default=MONTH,
    show_default=True,
    help="The budget's window: day, week (from Monday), month (UTC) or 5h (from a request).",
)


class ModelIds(click.ParamType):
    """A comma-separated list of model ids."""

    name = "models"

    def convert(self, value: object, param: object, ctx: object) -> list[str]:
        """Split ``value`` at commas, dropping blanks."""
        if isinstance(value, list):
            return value
        return [model_id.strip() for model_id in str(value).split(",") if model_id.strip()]


@contextmanager
def operator_errors() -> Iterator[None]:
    """Turn the domain's refusals into one line on stderr and exit status 1."""
    try:
        yield
    except (
        AccountNotFound,
        AccountExists,
        KeyNotFound,
        MemberNotFound,
        AlreadyMember,
        LastOwner,
        IdempotencyConflict,
        GrantOutOfRange,
        InvalidKeyLimits,
        InvalidAlertSetting,
        EndpointNotFound,
        OrganisationNameRefused,
    ) as error:
        raise click.ClickException(str(error)) from None


def link_to(path: str, base_url: str | None) -> str:
    """Return the dashboard's ``path`` under ``base_url``, else where its users reach it.

    That is PUBLIC_URL (the app's setting, read from the environment or a config file),
    else localhost on $PORT: a link printed or mailed must open where its holder is.
    """
    base = (
        base_url
        or current_app.config.get("PUBLIC_URL")
        or os.environ.get("PUBLIC_URL")
        or f"http://localhost:{os.environ.get('PORT', '8000')}"
    )
    return f"{base.rstrip('/')}{path}"


BASE_URL_OPTION = click.option(
    "--base-url",
    show_default="PUBLIC_URL, else http://localhost:$PORT",
    help="The dashboard's address as its users reach it.",
)


JSON_OPTION = click.option(
    "--json", "as_json", is_flag=True, help="Print a JSON array, an object a row, for scripts."
)


def echo_listing(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str],
    cells: Callable[[Mapping[str, object]], Sequence[object]],
    *,
    as_json: bool,
    empty: str,
) -> None:
    """Print ``rows`` as JSON, or as a header and tab-separated lines; ``empty`` if none."""
    if as_json:
        click.echo(json.dumps(list(rows), indent=2))
    elif not rows:
        click.echo(empty)
    else:
        click.echo("\t".join(columns))
        for row in rows:
            click.echo("\t".join(str(cell) for cell in cells(row)))


ORG_OPTION = click.option(
    "--org", "org", help="The organisation, by id or name (instead of an account's EMAIL)."
)


def organisation_or_account(org: str | None, email: str | None) -> Account:
    """Return the organisation ``--org`` names, else the account of ``email``."""
    if org is not None:
        return find_organisation(org)
    if email is None:
        raise click.ClickException("name the account's EMAIL or an organisation with --org")
    return find_account_or_raise(email)
