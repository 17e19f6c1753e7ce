"""Operator commands: ``flask accounts|credits|keys|catalog|ledger|usage ...``.

Each command parses its arguments, calls one domain function and echoes the result.
A command that issues a key prints the value alone on the last line of stdout, so that
``KEY=$(flask keys create ... | tail -1)`` works. Wrong input: one line on stderr, exit 1.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal, InvalidOperation

import click
from flask import Flask
from flask.cli import AppGroup

from app.accounts import budgets, keys
from app.accounts.changes import record_change
from app.accounts.errors import (
    AlreadyMember,
    InvalidKeyLimits,
    KeyNotFound,
    LastOwner,
    MemberNotFound,
)
from app.accounts.links import OPERATOR_LINK_LIFETIME, invite_account_holder, issue_password_link
from app.accounts.members import (
    OPERATOR,
    create_organisation,
    find_member_by_email,
    find_organisation,
    invite_member,
    list_members,
    remove_member,
)
from app.accounts.models import ROLES
from app.accounts.organisations import create_account, owner_membership
from app.accounts.passwords import set_password
from app.alerts.endpoints import (
    EndpointNotFound,
    InvalidAlertSetting,
    active_endpoints,
    add_email,
    add_webhook,
    balance_threshold,
    budget_alert_percent,
    delivery_log,
    remove_endpoint,
    set_balance_threshold,
    set_budget_alert_percent,
)
from app.alerts.models import EMAIL, WEBHOOK
from app.budgets import MONTH, WINDOWS, budget_state
from app.catalog.registry import current_catalog
from app.credits import ledger
from app.credits.accounts import (
    AccountExists,
    AccountNotFound,
    find_account,
    find_account_or_raise,
)
from app.credits.errors import GrantOutOfRange, IdempotencyConflict
from app.credits.models import Account
from app.database import utcnow
from app.extensions import db
from app.generations.audit import audit_ledger
from app.generations.rollups import rebuild_rollups
from app.money import MAX_MONEY, MONEY_QUANTUM, exact_money
from app.providers.base import Route
from app.providers.cooldown import upstream_cooldowns


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


accounts_cli = OperatorGroup("accounts", help="Create accounts and invite their holders.")
credits_cli = OperatorGroup("credits", help="Add credits to accounts.")
keys_cli = OperatorGroup("keys", help="Issue, rotate, revoke, delete and list API keys.")
catalog_cli = OperatorGroup("catalog", help="Inspect the model catalog.")
ledger_cli = OperatorGroup("ledger", help="Check the ledger's books.")
usage_cli = OperatorGroup("usage", help="Keep the hourly usage rollups.")
demo_cli = OperatorGroup("demo", help="Set up the demo account of a fresh checkout.")
orgs_cli = OperatorGroup("orgs", help="Create organisations, their members and budgets.")
alerts_cli = OperatorGroup("alerts", help="An organisation's alerts: threshold, endpoints, log.")
webhook_cli = OperatorGroup("webhook", help="Add, list and remove webhook endpoints.")
email_cli = OperatorGroup("email", help="Add, list and remove e-mail recipients of alerts.")
alerts_cli.add_command(webhook_cli)
alerts_cli.add_command(email_cli)

DEMO_EMAIL = "demo@example.com"
DEMO_CREDITS = Decimal("10")


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
    ) as error:
        raise click.ClickException(str(error)) from None


@accounts_cli.command("create")
@click.argument("email")
@click.option("--credits", "amount", type=INITIAL_USD, help="Initial credits in USD (0 or more).")
@click.option("--admin", is_flag=True, help="Make the account an administrator.")
def create_account_command(email: str, amount: Decimal | None, admin: bool) -> None:
    """Create an account, optionally with credits."""
    with operator_errors():
        account = create_account(email=email, is_admin=admin)
        if amount:
            ledger.grant_credits(account_id=account.id, amount=amount, description="initial")
    click.echo(f"created account {account.id} {email} balance=${account.balance:f}")


def _public_url() -> str:
    """Return the dashboard's address as its users reach it: PUBLIC_URL, else localhost."""
    return os.environ.get("PUBLIC_URL") or f"http://localhost:{os.environ.get('PORT', '8000')}"


BASE_URL_OPTION = click.option(
    "--base-url",
    default=_public_url,
    show_default="PUBLIC_URL, else http://localhost:$PORT",
    help="The dashboard's address as its users reach it.",
)


@accounts_cli.command("invite")
@click.argument("email")
@BASE_URL_OPTION
def invite_command(email: str, base_url: str) -> None:
    """Print a one-time link, valid 24 hours, where EMAIL sets a dashboard password."""
    with operator_errors():
        token = invite_account_holder(email)
    click.echo(f"invite for {email}, valid for 24 hours and for one use:")
    click.echo(f"{base_url.rstrip('/')}/password/{token}")


@accounts_cli.command("password-link")
@click.argument("email")
@BASE_URL_OPTION
def password_link_command(email: str, base_url: str) -> None:
    """Print a one-time link, valid 24 hours, where EMAIL sets a new dashboard password."""
    with operator_errors():
        token = issue_password_link(email, lifetime=OPERATOR_LINK_LIFETIME)
    click.echo(f"password link for {email}, valid for 24 hours and for one use:")
    click.echo(f"{base_url.rstrip('/')}/password/{token}")


ORG_OPTION = click.option(
    "--org", "org", help="The organisation, by id or name (instead of an account's EMAIL)."
)


def _organisation(org: str | None, email: str | None) -> Account:
    """Return the organisation ``--org`` names, else the account of ``email``."""
    if org is not None:
        return find_organisation(org)
    if email is None:
        raise click.ClickException("name the account's EMAIL or an organisation with --org")
    return find_account_or_raise(email)


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
        account = _organisation(org, target[0] if len(target) == 2 else None)
        _, applied = ledger.grant_credits(
            account_id=account.id, amount=amount, idempotency_key=idempotency_key
        )
        if applied:
            record_change(None, account.id, "credits.grant", "balance", {"amount": f"{amount:f}"})
            db.session.commit()
    state = "granted" if applied else "already granted"
    db.session.refresh(account)
    whom = account.email or account.name
    click.echo(f"{state} ${amount:f} to {whom}; balance=${account.balance:f}")


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
        account = _organisation(org, None if org else email)
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


@catalog_cli.command("list")
def list_catalog_command() -> None:
    """List the served models, with prices and routes.

    Tokens are priced in USD per million, tool calls in USD per call; tiers multiply them.
    """
    click.echo(
        "id\tprompt\tcompletion\tcached_read\timage\tcache_write\tcache_write_1h\t"
        "tool_calls\ttiers\tcontext\tcapabilities\troutes"
    )
    for model in current_catalog().list():
        p = model.pricing
        routes = ",".join(
            f"{r.adapter.upstream.name}:{r.target.upstream_model}{route_state(r)}"
            for r in model.routes
        )
        click.echo(
            f"{model.id}\t{p.prompt}\t{p.completion}\t{p.cached_read}\t{p.image}\t{p.cache_write}\t"
            f"{p.cache_write_1h}\t{price_list(p.tool_calls)}\t{price_list(p.tiers)}\t"
            f"{model.context_length}\t{','.join(sorted(model.capabilities)) or '-'}\t{routes}"
        )


def price_list(prices: Mapping[str, Decimal]) -> str:
    """Render a catalog's price table (tool calls, tiers) as ``name=price,...``, or ``-``."""
    return ",".join(f"{name}={price}" for name, price in sorted(prices.items())) or "-"


def route_state(route: Route) -> str:
    """Say when a route's upstream is cooling down or failing (state shared through Redis)."""
    state = upstream_cooldowns.state(route.adapter.upstream)
    if state.seconds_left > 0:
        return f" (cooling down, {math.ceil(state.seconds_left)}s left)"
    if state.failures:
        return f" ({state.failures} failures in a row)"
    return ""


@ledger_cli.command("audit")
@click.option(
    "--account", "account_ids", type=int, multiple=True, help="Check only this account (repeat)."
)
@click.option("--full", is_flag=True, help="Re-check everything, not only what is new.")
def audit_command(account_ids: tuple[int, ...], full: bool) -> None:
    """Check balance = sum of ledger, every charge against its prices, the usage rollups.

    Each account from its last clean checkpoint on (``--full``: from the start); exit 1
    on a mismatch. Generations charged less than their price (the balance or the key's
    limit ran out) are listed as shortfalls, and streams charged from their last recorded
    progress (their worker stopped) as estimated: the books still add up.
    """
    report = audit_ledger(account_ids or None, full=full)
    for mismatch in report.mismatches:
        click.echo(f"mismatch: {mismatch}", err=True)
    for shortfall in report.shortfalls:
        click.echo(f"shortfall: {shortfall}")
    for estimated in report.estimated:
        click.echo(f"estimated: {estimated}")
    click.echo(
        f"checked {report.accounts} accounts and {report.generations} generations: "
        f"{len(report.mismatches)} mismatches, {len(report.shortfalls)} shortfalls, "
        f"{len(report.estimated)} estimated"
    )
    if report.mismatches:
        raise SystemExit(1)


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


@demo_cli.command("setup")
def demo_setup_command() -> None:
    """Create the demo account with credits and print its key, once; later runs print none."""
    if find_account(DEMO_EMAIL) is not None:
        click.echo(f"the demo account {DEMO_EMAIL} exists; its key was printed when it was made")
        click.echo(f"(a new one: flask keys create {DEMO_EMAIL} --name another)")
        return
    account = create_account(email=DEMO_EMAIL)
    ledger.grant_credits(account_id=account.id, amount=DEMO_CREDITS, description="demo")
    password = secrets.token_urlsafe(12)
    set_password(owner_membership(account.id).person_id, password)
    issued = keys.create_key(account_id=account.id, name="demo")
    click.echo(f"dashboard: sign in at /signin as {DEMO_EMAIL} with the password {password}")
    click.echo(f"demo account {DEMO_EMAIL} with ${DEMO_CREDITS} of credits; its API key:")
    click.echo(issued.value)


@orgs_cli.command("create")
@click.argument("name")
@click.option("--owner", "owner_email", required=True, help="The owner's email.")
@click.option("--credits", "amount", type=INITIAL_USD, help="Initial credits in USD (0 or more).")
def create_organisation_command(name: str, owner_email: str, amount: Decimal | None) -> None:
    """Create the organisation NAME owned by --owner (a new person sets a password by invite)."""
    with operator_errors():
        account = create_organisation(name=name, owner_email=owner_email, actor=None)
        if amount:
            ledger.grant_credits(account_id=account.id, amount=amount, description="initial")
    click.echo(f"created organisation {account.id} {account.name!r} owned by {owner_email}")


@orgs_cli.command("invite")
@click.argument("org")
@click.argument("email")
@click.option("--role", type=click.Choice(ROLES), default="member", show_default=True)
@BASE_URL_OPTION
def invite_member_command(org: str, email: str, role: str, base_url: str) -> None:
    """Print a one-time link, valid 24 hours, by which EMAIL joins ORG (id or name)."""
    with operator_errors():
        account = find_organisation(org)
        token = invite_member(account.id, OPERATOR, email=email, role=role)
    click.echo(f"invite for {email} to {account.name} as {role}, valid 24 hours, for one use:")
    click.echo(f"{base_url.rstrip('/')}/invite/{token}")


@orgs_cli.command("members")
@click.argument("org")
def list_members_command(org: str) -> None:
    """List ORG's members (id or name).

    Member id, role, email, since when, then the budget (or none), its window and what
    was spent in the window so far.
    """
    with operator_errors():
        account = find_organisation(org)
        rows = list_members(account.id)
    now = utcnow()
    for row in rows:
        member = row.membership
        budget = budget_state(member, now)
        amount = "none" if budget.amount is None else f"${budget.amount:f}"
        click.echo(
            f"{member.id}\t{member.role}\t{row.email}\t{member.created_at:%Y-%m-%d %H:%M}"
            f"\t{amount}\t{budget.window}\t${budget.spent:f}"
        )


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
            budgets.set_key_budget(key_id, amount=amount, window=window, account_id=account.id)
            subject = f"key {key_id}"
    state = "no budget" if amount is None else f"${amount:f} a {window}"
    click.echo(f"{subject} of {account.name}: {state}")


GROUPS: tuple[AppGroup, ...] = (
    accounts_cli,
    credits_cli,
    keys_cli,
    catalog_cli,
    ledger_cli,
    usage_cli,
    demo_cli,
    orgs_cli,
    alerts_cli,
)


@alerts_cli.command("balance")
@click.argument("org")
@click.option("--below", "amount", type=USD_OR_NONE, help="Alert under this USD balance, or none.")
def alert_balance_command(org: str, amount: Decimal | None) -> None:
    """Show ORG's balance threshold (id or name); --below sets it, --below none clears it.

    balance.below_threshold fires once when a charge takes the balance below it, and
    again only after a grant lifted the balance back to it or above.
    """
    with operator_errors():
        account = find_organisation(org)
        if _given("amount"):
            set_balance_threshold(account.id, amount)
        threshold = balance_threshold(account.id)
    state = "no balance alert" if threshold is None else f"alert below ${threshold:f}"
    click.echo(f"{account.name}: {state}")


@alerts_cli.command("budget")
@click.argument("org")
@click.option(
    "--percent", type=PercentOrNone(), help="Alert at this share (1-99) of a budget, or none."
)
def alert_budget_command(org: str, percent: int | None) -> None:
    """Show at what share of a budget ORG is alerted; --percent sets it, none clears it.

    budget.threshold_reached fires once a window when a member's or key's spend reaches
    that share of its budget (80 unless set); budget.exhausted at the whole budget.
    """
    with operator_errors():
        account = find_organisation(org)
        if _given("percent"):
            set_budget_alert_percent(account.id, percent)
        share = budget_alert_percent(account.id)
    early = "" if share is None else f"at {share}% of a budget and "
    click.echo(f"{account.name}: alert {early}when a budget is used up")


def _given(name: str) -> bool:
    """Return whether the option ``name`` was on the command line (``none`` included)."""
    source = click.get_current_context().get_parameter_source(name)
    return source == click.core.ParameterSource.COMMANDLINE


@webhook_cli.command("add")
@click.argument("org")
@click.argument("url")
def add_webhook_command(org: str, url: str) -> None:
    """Send ORG's alerts to URL, signed; print the signing secret, shown this once."""
    with operator_errors():
        account = find_organisation(org)
        endpoint, secret = add_webhook(account.id, url)
    click.echo(f"webhook {endpoint.id} of {account.name}: {endpoint.shown_target}")
    click.echo(f"signing secret (shown once, keep it now): {secret}")


@email_cli.command("add")
@click.argument("org")
@click.argument("address")
def add_email_command(org: str, address: str) -> None:
    """Mail ORG's alerts to ADDRESS (through SMTP_URL)."""
    with operator_errors():
        account = find_organisation(org)
        endpoint = add_email(account.id, address)
    click.echo(f"e-mail recipient {endpoint.id} of {account.name}: {address}")


def _list_endpoints(org: str, kind: str) -> None:
    with operator_errors():
        account = find_organisation(org)
        endpoints = [e for e in active_endpoints(account.id) if e.kind == kind]
    for endpoint in endpoints:
        click.echo(f"{endpoint.id}\t{endpoint.shown_target}\t{endpoint.created_at:%Y-%m-%d %H:%M}")


def _remove_endpoint(org: str, endpoint_id: int) -> None:
    with operator_errors():
        account = find_organisation(org)
        remove_endpoint(account.id, endpoint_id)
    click.echo(f"removed alert endpoint {endpoint_id} of {account.name}")


@webhook_cli.command("list")
@click.argument("org")
def list_webhooks_command(org: str) -> None:
    """List ORG's webhooks: id, URL, since when (never their secrets)."""
    _list_endpoints(org, WEBHOOK)


@email_cli.command("list")
@click.argument("org")
def list_emails_command(org: str) -> None:
    """List ORG's e-mail recipients: id, address, since when."""
    _list_endpoints(org, EMAIL)


@webhook_cli.command("remove")
@click.argument("org")
@click.argument("endpoint_id", type=int)
def remove_webhook_command(org: str, endpoint_id: int) -> None:
    """Stop sending ORG's alerts to the webhook ENDPOINT_ID."""
    _remove_endpoint(org, endpoint_id)


@email_cli.command("remove")
@click.argument("org")
@click.argument("endpoint_id", type=int)
def remove_email_command(org: str, endpoint_id: int) -> None:
    """Stop mailing ORG's alerts to the recipient ENDPOINT_ID."""
    _remove_endpoint(org, endpoint_id)


@alerts_cli.command("log")
@click.argument("org")
def alert_log_command(org: str) -> None:
    """Show ORG's latest deliveries: id, event, endpoint, status, tries, last answer, next try."""
    with operator_errors():
        account = find_organisation(org)
        lines = delivery_log(account.id)
    for line in lines:
        delivery = line.delivery
        answer = delivery.last_error or (delivery.last_status or "")
        next_try = (
            f"{delivery.next_attempt_at:%Y-%m-%d %H:%M:%S}" if delivery.next_attempt_at else "-"
        )
        click.echo(
            f"{delivery.id}\tevt_{line.event.id}\t{line.event.type}\t{line.endpoint.shown_target}"
            f"\t{delivery.status}\t{delivery.attempts}\t{answer}\t{next_try}"
        )


def register(app: Flask, groups: tuple[AppGroup, ...] = GROUPS) -> None:
    """Add the command groups to ``app.cli``."""
    for group in groups:
        app.cli.add_command(group)
