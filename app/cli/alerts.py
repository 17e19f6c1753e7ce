"""``flask alerts ...``: an organisation's alert thresholds, endpoints and log."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import click

from app.accounts.members import (
    find_organisation,
)
from app.alerts.endpoints import (
    DeliveryLine,
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
from app.cli.common import (
    JSON_OPTION,
    USD_OR_NONE,
    OperatorGroup,
    PercentOrNone,
    echo_listing,
    operator_errors,
)

alerts_cli = OperatorGroup("alerts", help="An organisation's alerts: threshold, endpoints, log.")


webhook_cli = OperatorGroup("webhook", help="Add, list and remove webhook endpoints.")


email_cli = OperatorGroup("email", help="Add, list and remove e-mail recipients of alerts.")


alerts_cli.add_command(webhook_cli)
alerts_cli.add_command(email_cli)


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
    click.echo("signing secret, shown once (keep it now), on the next line:")
    click.echo(secret)


@email_cli.command("add")
@click.argument("org")
@click.argument("address")
def add_email_command(org: str, address: str) -> None:
    """Mail ORG's alerts to ADDRESS (through SMTP_URL)."""
    with operator_errors():
        account = find_organisation(org)
        endpoint = add_email(account.id, address)
    click.echo(f"e-mail recipient {endpoint.id} of {account.name}: {address}")


ENDPOINT_LISTS = {WEBHOOK: ("url", "webhooks"), EMAIL: ("address", "e-mail recipients")}


def _list_endpoints(org: str, kind: str, as_json: bool) -> None:
    with operator_errors():
        account = find_organisation(org)
        endpoints = [e for e in active_endpoints(account.id) if e.kind == kind]
    target, plural = ENDPOINT_LISTS[kind]
    rows = [
        {"id": e.id, target: e.shown_target, "since": e.created_at.isoformat()} for e in endpoints
    ]
    echo_listing(
        rows,
        ("id", target, "since"),
        lambda row: [row["id"], row[target], _minute(row["since"])],
        as_json=as_json,
        empty=f"{account.name} has no {plural}",
    )


def _minute(iso: object) -> str:
    """Show an ISO timestamp to the minute, as the other listings do."""
    return f"{datetime.fromisoformat(str(iso)):%Y-%m-%d %H:%M}"


def _remove_endpoint(org: str, endpoint_id: int) -> None:
    with operator_errors():
        account = find_organisation(org)
        remove_endpoint(account.id, endpoint_id)
    click.echo(f"removed alert endpoint {endpoint_id} of {account.name}")


@webhook_cli.command("list")
@click.argument("org")
@JSON_OPTION
def list_webhooks_command(org: str, as_json: bool) -> None:
    """List ORG's webhooks: id, URL, since when (never their secrets)."""
    _list_endpoints(org, WEBHOOK, as_json)


@email_cli.command("list")
@click.argument("org")
@JSON_OPTION
def list_emails_command(org: str, as_json: bool) -> None:
    """List ORG's e-mail recipients: id, address, since when."""
    _list_endpoints(org, EMAIL, as_json)


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
@JSON_OPTION
def alert_log_command(org: str, as_json: bool) -> None:
    """Show ORG's latest deliveries: id, event, endpoint, status, tries, last answer, next try."""
    with operator_errors():
        account = find_organisation(org)
        rows = [_delivery_row(line) for line in delivery_log(account.id)]
    echo_listing(
        rows,
        DELIVERY_COLUMNS,
        lambda row: [row[c] if row[c] is not None else "-" for c in DELIVERY_COLUMNS],
        as_json=as_json,
        empty=f"{account.name} has no alert deliveries",
    )


DELIVERY_COLUMNS = (
    "id", "event", "type", "endpoint", "status", "tries", "last_answer", "next_try",
)  # fmt: skip


def _delivery_row(line: DeliveryLine) -> dict[str, object]:
    delivery = line.delivery
    next_try = delivery.next_attempt_at
    return {
        "id": delivery.id,
        "event": f"evt_{line.event.id}",
        "type": line.event.type,
        "endpoint": line.endpoint.shown_target,
        "status": delivery.status,
        "tries": delivery.attempts,
        "last_answer": delivery.last_error or (str(delivery.last_status or "")),
        "next_try": f"{next_try:%Y-%m-%d %H:%M:%S}" if next_try else None,
    }
