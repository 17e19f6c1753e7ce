"""An organisation's alert settings: its balance threshold, endpoints and delivery log."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import select, update

from app.accounts.changes import record_change
from app.alerts.models import EMAIL, WEBHOOK, AlertDelivery, AlertEndpoint, AlertEvent
from app.alerts.networks import literal_refusal
from app.alerts.secrets import new_secret, seal
from app.credits.models import Account
from app.database import utcnow
from app.extensions import db

DELIVERIES_SHOWN = 100


class InvalidAlertSetting(ValueError):
    """A threshold, URL or address that cannot be used."""


class EndpointNotFound(LookupError):
    """No active endpoint of the organisation has that id."""


def set_balance_threshold(account_id: int, usd: Decimal | None, actor: int | None = None) -> None:
    """Alert the organisation when its balance falls below ``usd``; None stops it."""
    if usd is not None and (not usd.is_finite() or usd <= 0):
        raise InvalidAlertSetting("the threshold must be a positive amount of USD")
    db.session.execute(update(Account).where(Account.id == account_id).values(alert_below=usd))
    record_change(
        actor,
        account_id,
        "alerts.balance",
        f"organisation:{account_id}",
        {"below": None if usd is None else f"{usd:f}"},
    )
    db.session.commit()


def balance_threshold(account_id: int) -> Decimal | None:
    """Return the organisation's balance threshold, or None."""
    return db.session.scalar(select(Account.alert_below).where(Account.id == account_id))


def set_budget_alert_percent(
    account_id: int, percent: int | None, actor: int | None = None
) -> None:
    """Alert when a budget reaches ``percent`` of its window (None: only when used up).

    Every member's and key's budget in the organisation shares it; ``budget.exhausted``
    fires at the whole budget whatever it is.
    """
    if percent is not None and not 1 <= percent <= 99:
        raise InvalidAlertSetting("the budget alert percentage must be from 1 to 99")
    db.session.execute(
        update(Account).where(Account.id == account_id).values(budget_alert_percent=percent)
    )
    record_change(
        actor, account_id, "alerts.budget", f"organisation:{account_id}", {"percent": percent}
    )
    db.session.commit()


def budget_alert_percent(account_id: int) -> int | None:
    """Return the share of a budget at which the organisation is alerted, or None."""
    return db.session.scalar(select(Account.budget_alert_percent).where(Account.id == account_id))


def add_webhook(account_id: int, url: str, actor: int | None = None) -> tuple[AlertEndpoint, str]:
    """Add a webhook endpoint; return it and its signing secret, which is shown only now."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 2000:
        raise InvalidAlertSetting("a webhook URL must be an http:// or https:// URL")
    try:
        parts.port  # noqa: B018 - read for its check: a port out of range raises
    except ValueError:
        raise InvalidAlertSetting("a webhook URL's port must be from 1 to 65535") from None
    if refused := literal_refusal(parts.hostname):
        raise InvalidAlertSetting(f"a webhook may not be sent there: {refused}")
    secret = new_secret()
    bare, userinfo = split_userinfo(url)
    endpoint = AlertEndpoint(
        account_id=account_id,
        kind=WEBHOOK,
        target=bare,
        sealed_secret=seal(secret),
        sealed_userinfo=seal(userinfo) if userinfo else None,
    )
    return _add(endpoint, actor), secret


def split_userinfo(url: str) -> tuple[str, str | None]:
    """Return ``url`` without its ``user:password@``, and that userinfo (None if it has none)."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), userinfo


def add_email(account_id: int, address: str, actor: int | None = None) -> AlertEndpoint:
    """Add an e-mail recipient of the organisation's alerts."""
    address = address.strip()
    if "@" not in address or len(address) > 320 or any(c in address for c in " \r\n,<>"):
        raise InvalidAlertSetting("an e-mail recipient must be one address")
    return _add(AlertEndpoint(account_id=account_id, kind=EMAIL, target=address), actor)


def _add(endpoint: AlertEndpoint, actor: int | None) -> AlertEndpoint:
    db.session.add(endpoint)
    db.session.flush()
    record_change(
        actor,
        endpoint.account_id,
        f"alerts.{endpoint.kind}.add",
        f"endpoint:{endpoint.id}",
        {"target": endpoint.shown_target},
    )
    db.session.commit()
    return endpoint


def active_endpoints(account_id: int) -> list[AlertEndpoint]:
    """Return the organisation's endpoints that receive alerts, oldest first."""
    return list(
        db.session.scalars(
            select(AlertEndpoint)
            .where(AlertEndpoint.account_id == account_id, AlertEndpoint.removed_at.is_(None))
            .order_by(AlertEndpoint.id)
        )
    )


def remove_endpoint(account_id: int, endpoint_id: int, actor: int | None = None) -> None:
    """Stop sending the organisation's alerts to the endpoint (its log is kept)."""
    endpoint = db.session.get(AlertEndpoint, endpoint_id)
    if endpoint is None or endpoint.account_id != account_id or endpoint.removed_at:
        raise EndpointNotFound(f"no alert endpoint {endpoint_id} in this organisation")
    endpoint.removed_at = utcnow()
    record_change(actor, account_id, f"alerts.{endpoint.kind}.remove", f"endpoint:{endpoint_id}")
    db.session.commit()


@dataclass(frozen=True)
class DeliveryLine:
    """One line of the delivery log."""

    delivery: AlertDelivery
    event: AlertEvent
    endpoint: AlertEndpoint


def delivery_log(account_id: int, limit: int = DELIVERIES_SHOWN) -> list[DeliveryLine]:
    """Return the organisation's latest deliveries, newest first."""
    rows = db.session.execute(
        select(AlertDelivery, AlertEvent, AlertEndpoint)
        .join(AlertEvent, AlertEvent.id == AlertDelivery.event_id)
        .join(AlertEndpoint, AlertEndpoint.id == AlertDelivery.endpoint_id)
        .where(AlertEvent.account_id == account_id)
        .order_by(AlertDelivery.id.desc())
        .limit(limit)
    ).all()
    return [DeliveryLine(*row) for row in rows]
